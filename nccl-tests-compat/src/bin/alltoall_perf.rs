//! nccl-tests' `alltoall_perf`.
fn main() {
    nccl_tests_compat::perf_main(nccl_tests_compat::colls::Coll::AlltoAll)
}
