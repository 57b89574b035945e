//! nccl-tests' `scatter_perf`.
fn main() {
    nccl_tests_compat::perf_main(nccl_tests_compat::colls::Coll::Scatter)
}
