//! The link budget of `libnccl.so.2`: a process that loads our NCCL must not get a database
//! engine, a command-line parser or a log subscriber with it. Those belong to `ccld` (the
//! analyzer's command line and its SQLite history), which the library must never reach.
//!
//! Checked on Cargo's own resolution of `ccl-ffi`'s normal dependencies (`cargo tree`), so
//! that a new dependency edge anywhere below the library fails here, not in a size report.

use std::process::Command;

/// Crates the library must not link, with the reason each is out.
const FORBIDDEN: &[(&str, &str)] = &[
    ("ccld", "the analyzer's command line"),
    ("rusqlite", "the SQLite history of `ccld serve --data-dir`"),
    ("libsqlite3-sys", "the SQLite engine itself"),
    ("clap", "a command-line parser"),
    ("tracing-subscriber", "a process-wide log subscriber"),
];

fn normal_dependencies_of_ccl_ffi() -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "ccl-ffi",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn libnccl_links_no_database_cli_parser_or_log_subscriber() {
    let deps = normal_dependencies_of_ccl_ffi();
    // The listing is real: the library's own runtime and the probe are in it.
    for needed in ["ccl-ffi", "ccl-core", "probe", "ccld-wire"] {
        assert!(
            deps.iter().any(|d| d == needed),
            "{needed} missing in {deps:?}"
        );
    }
    let found: Vec<String> = FORBIDDEN
        .iter()
        .filter(|(name, _)| deps.iter().any(|d| d == name))
        .map(|(name, why)| format!("{name} ({why})"))
        .collect();
    assert!(found.is_empty(), "libnccl.so.2 links: {}", found.join(", "));
}
