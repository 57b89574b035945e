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

/// The options of a sweep of sizes measured against a peer, shared by net-bench and
/// bench-peers with one meaning: rounds, smallest and largest size in bytes, size factor,
/// timed iterations per size, the MPI peer's binary.
pub const SWEEP_OPTIONS: [&str; 6] = [
    "--rounds",
    "--min",
    "--max",
    "--factor",
    "--iters",
    "--mpi-bin",
];

/// A sweep of sizes measured against a peer, as [`SWEEP_OPTIONS`] give it (all but
/// `--mpi-bin`): rounds, smallest and largest size in bytes, size factor, timed iterations
/// per size.
#[derive(Clone, Copy, Debug)]
pub struct Sweep {
    pub rounds: usize,
    pub min: u64,
    pub max: u64,
    pub factor: u64,
    pub iters: u32,
}

impl Sweep {
    /// Takes `opt value` when `opt` is one of the sweep's options (true), [`fail`]ing on a
    /// value that is not a number or does not fit.
    pub fn take(&mut self, prog: &str, usage: &str, opt: &str, value: &str) -> bool {
        let num = || number(prog, usage, opt, value);
        match opt {
            "--rounds" => self.rounds = num() as usize,
            "--min" => self.min = num(),
            "--max" => self.max = num(),
            "--factor" => self.factor = num(),
            "--iters" => self.iters = number_u32(prog, usage, opt, value),
            _ => return false,
        }
        true
    }

    /// [`fail`]s (status 2) unless 4 <= `min` <= `max`, `factor` >= 2, `rounds` >= 1 and
    /// `iters` >= 1, instead of running a sweep that measures nothing or never ends.
    pub fn check(&self, prog: &str, usage: &str) {
        let Sweep {
            rounds,
            min,
            max,
            factor,
            iters,
        } = *self;
        if min < 4 || max < min || factor < 2 || rounds == 0 || iters == 0 {
            fail(
                prog,
                usage,
                &format!(
                    "need 4 <= min ({min}) <= max ({max}), factor ({factor}) >= 2, rounds ({rounds}) >= 1, iters ({iters}) >= 1"
                ),
            );
        }
    }
}

/// `value` of option `opt` as a non-negative integer; anything else [`fail`]s, naming both.
pub fn number(prog: &str, usage: &str, opt: &str, value: &str) -> u64 {
    value
        .parse()
        .unwrap_or_else(|_| fail(prog, usage, &format!("{opt}: not a number: {value}")))
}

/// [`number`] that must also fit a `u32` (an iteration count): a larger value [`fail`]s
/// instead of wrapping around.
pub fn number_u32(prog: &str, usage: &str, opt: &str, value: &str) -> u32 {
    u32::try_from(number(prog, usage, opt, value))
        .unwrap_or_else(|_| fail(prog, usage, &format!("{opt}: {value} is too large")))
}

/// Prints `prog: msg` and `usage`, and exits with status 2.
pub fn fail(prog: &str, usage: &str, msg: &str) -> ! {
    eprintln!("{prog}: {msg}");
    eprintln!("{usage}");
    std::process::exit(2)
}
