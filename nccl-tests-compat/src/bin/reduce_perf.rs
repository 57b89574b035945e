//! nccl-tests' `reduce_perf`.
fn main() {
    nccl_tests_compat::perf_main(nccl_tests_compat::colls::Coll::Reduce)
}
