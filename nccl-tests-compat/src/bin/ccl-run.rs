//! `ccl-run`: a small local launcher for multi-process runs (see the library's `ccl_run`).
fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match nccl_tests_compat::ccl_run::parse_args(&argv) {
        Ok(o) => std::process::exit(nccl_tests_compat::ccl_run::run(&o)),
        Err(e) => {
            if !e.is_empty() {
                eprintln!("ccl-run: {e}");
            }
            eprint!("{}", nccl_tests_compat::ccl_run::USAGE);
            std::process::exit(if e.is_empty() { 0 } else { 2 })
        }
    }
}
