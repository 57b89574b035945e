//! nccl-tests' `all_reduce_perf`.
fn main() {
    nccl_tests_compat::perf_main(nccl_tests_compat::colls::Coll::AllReduce)
}
