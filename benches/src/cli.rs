//! Command lines of the benchmark binaries: `--option value` pairs, `--help`, and clear
//! errors for an unknown option or a missing value.

/// `args` as `(option, value)` pairs. `-h`/`--help` prints `usage` and exits with status 0;
/// an option not in `known`, or one without a value, prints what is wrong and `usage` and
/// exits with status 2.
pub fn option_pairs(
    prog: &str,
    usage: &str,
    args: &[String],
    known: &[&str],
) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let opt = args[i].as_str();
        if matches!(opt, "-h" | "--help") {
            eprintln!("{usage}");
            std::process::exit(0);
        }
        if !known.contains(&opt) {
            fail(prog, usage, &format!("unknown option {opt}"));
        }
        let Some(value) = args.get(i + 1) else {
            fail(prog, usage, &format!("{opt} needs a value"));
        };
        pairs.push((opt.to_string(), value.clone()));
        i += 2;
    }
    pairs
}

/// Prints `prog: msg` and `usage`, and exits with status 2.
pub fn fail(prog: &str, usage: &str, msg: &str) -> ! {
    eprintln!("{prog}: {msg}");
    eprintln!("{usage}");
    std::process::exit(2)
}
