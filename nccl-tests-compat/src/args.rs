//! Command line of the `*_perf` binaries: nccl-tests' short and long options
//! (getopt_long rules: `-b8`, `-b 8`, `--minbytes 8`, `--minbytes=8`, unique long-option
//! prefixes), defaults and value parsing (`strtol(.., 0)` for integers, K/M/G sizes).
//! Pure logic: the caller prints and exits.

use crate::dtype::{DataType, RedOp};

/// Which types / ops / roots to iterate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice<T> {
    /// One value.
    One(T),
    /// Every value (`all`, or root -1).
    All,
}

/// Parsed options with nccl-tests' defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// -t
    pub nthreads: i64,
    /// -g
    pub ngpus: i64,
    /// -b
    pub min_bytes: u64,
    /// -e
    pub max_bytes: u64,
    /// -i
    pub step_bytes: u64,
    /// -f
    pub step_factor: u64,
    /// -n
    pub iters: i64,
    /// -w
    pub warmup_iters: i64,
    /// -m
    pub agg_iters: i64,
    /// -N
    pub run_cycles: i64,
    /// -p
    pub parallel_init: i64,
    /// -c
    pub check: i64,
    /// -o
    pub op: Choice<RedOp>,
    /// -d
    pub dtype: Choice<DataType>,
    /// -r
    pub root: Choice<i64>,
    /// -z
    pub blocking: i64,
    /// -y
    pub stream_null: i64,
    /// -T
    pub timeout: i64,
    /// -G
    pub cudagraph: i64,
    /// -C
    pub report_cputime: i64,
    /// -S
    pub report_timestamps: i64,
    /// -J
    pub output_file: Option<String>,
    /// -a
    pub average: i64,
    /// -R
    pub local_register: i64,
    /// -u
    pub unalign: i64,
    /// -I
    pub per_iter_timing: i64,
    /// -K
    pub per_iter_skip: i64,
    /// -M
    pub memory: i64,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            nthreads: 1,
            ngpus: 1,
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_bytes: 1 << 20,
            step_factor: 1,
            iters: 20,
            warmup_iters: 1,
            agg_iters: 1,
            run_cycles: 1,
            parallel_init: 0,
            check: 1,
            op: Choice::One(RedOp::Sum),
            dtype: Choice::One(DataType::Float),
            root: Choice::One(0),
            blocking: 0,
            stream_null: 0,
            timeout: 0,
            cudagraph: 0,
            report_cputime: 0,
            report_timestamps: 0,
            output_file: None,
            average: 1,
            local_register: 0,
            unalign: 0,
            per_iter_timing: 0,
            per_iter_skip: 0,
            memory: 0,
        }
    }
}

/// The outcome of parsing: what the binary does next.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    /// Run with these options.
    Run(Box<Args>),
    /// Print the usage text to stdout (after `note`, if any) and exit 0 (`-h`, an unknown
    /// option or a missing argument, as nccl-tests does).
    Usage {
        /// e.g. "invalid option '-x'"
        note: Option<String>,
    },
    /// Print `message` to stderr and exit with `code`.
    Fail {
        /// Exit status (255 for nccl-tests' `return -1` cases, 6 for invalid usage).
        code: i32,
        /// Message for stderr.
        message: String,
    },
}

/// (short, long) option names; every option takes an argument except -h.
const OPTS: &[(char, &str)] = &[
    ('t', "nthreads"),
    ('g', "ngpus"),
    ('b', "minbytes"),
    ('e', "maxbytes"),
    ('i', "stepbytes"),
    ('f', "stepfactor"),
    ('n', "iters"),
    ('m', "agg_iters"),
    ('w', "warmup_iters"),
    ('N', "run_cycles"),
    ('p', "parallel_init"),
    ('c', "check"),
    ('o', "op"),
    ('d', "datatype"),
    ('r', "root"),
    ('z', "blocking"),
    ('y', "stream_null"),
    ('T', "timeout"),
    ('G', "cudagraph"),
    ('C', "report_cputime"),
    ('S', "report_timestamps"),
    ('J', "output_file"),
    ('a', "average"),
    ('R', "local_register"),
    ('u', "unalign"),
    ('I', "per_iter_timing"),
    ('K', "per_iter_skip"),
    ('M', "memory"),
    ('h', "help"),
];

/// The usage text (`prog` is the program's base name).
pub fn usage(prog: &str) -> String {
    let lines = [
        "[-t,--nthreads <num threads>]",
        "[-g,--ngpus <gpus per thread>]",
        "[-b,--minbytes <min size in bytes>]",
        "[-e,--maxbytes <max size in bytes>]",
        "[-i,--stepbytes <increment size>]",
        "[-f,--stepfactor <increment factor>]",
        "[-n,--iters <iteration count>]",
        "[-m,--agg_iters <aggregated iteration count>]",
        "[-w,--warmup_iters <warmup iteration count>]",
        "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)]",
        "[-p,--parallel_init <0/1>]",
        "[-c,--check <check iteration count>]",
        "[-o,--op <sum/prod/min/max/avg/mulsum/all>]",
        "[-d,--datatype <nccltype/all>]",
        "[-r,--root <root>]",
        "[-z,--blocking <0/1/2/3>]",
        "[-y,--stream_null <0/1>]",
        "[-T,--timeout <time in seconds>]",
        "[-G,--cudagraph <num graph launches>]",
        "[-C,--report_cputime <0/1>]",
        "[-S,--report_timestamps <0/1> report timestamps (default 0)]",
        "[-J,--output_file <file> write output to filepath, if accessible. Infer type from suffix (only json supported presently.)]",
        "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>]",
        "[-R,--local_register <0/1/2> enable local (1) or symmetric (2) buffer registration on send/recv buffers (default: disable (0))]",
        "[-u,--unalign <num elements> offset buffers by that many elements (default: 0)]",
        "[-I,--per_iter_timing <0/1> report per-iteration timing statistics (default: 0)]",
        "[-K,--per_iter_skip <count> iterations left out of the per-iteration statistics (default: 0)]",
        "[-M,--memory <0/1> report buffer memory usage (default: 0)]",
        "[-h,--help]",
    ];
    let mut s = format!("USAGE: {prog} \n\t");
    for (k, l) in lines.iter().enumerate() {
        s.push_str(l);
        if k + 1 < lines.len() {
            s.push_str(" \n\t");
        } else {
            s.push('\n');
        }
    }
    s
}

/// C `strtol(s, NULL, 0)`: leading blanks, optional sign, 0x/0 prefixes, stops at the
/// first invalid character, 0 when there are no digits; saturates like glibc.
pub fn strtol(s: &str) -> i64 {
    let t = s.trim_start();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (radix, digits) = if (t.starts_with("0x") || t.starts_with("0X"))
        && t[2..].chars().next().is_some_and(|c| c.is_ascii_hexdigit())
    {
        (16, &t[2..])
    } else if t.starts_with('0') {
        (8, t)
    } else {
        (10, t)
    };
    let mut v: i128 = 0;
    for c in digits.chars() {
        match c.to_digit(radix) {
            Some(d) => {
                v = (v * radix as i128 + d as i128).min(i64::MAX as i128 + 1);
            }
            None => break,
        }
    }
    let v = if neg { -v } else { v };
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// nccl-tests' size parser: a number (`strtod`), optional blanks, then an optional K/M/G
/// (either case; 1024-based; anything after that letter is ignored). `None` is invalid.
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim_start();
    // Longest prefix that parses as a float (like strtod / sscanf %lf).
    let mut end = 0;
    let bytes = t.as_bytes();
    let mut best = None;
    while end < bytes.len() {
        end += 1;
        if let Ok(v) = t[..end].parse::<f64>() {
            if !t[..end].ends_with(['e', 'E', '+', '-']) {
                best = Some((v, end));
            }
        }
        if !bytes[end - 1].is_ascii() {
            break;
        }
    }
    let (v, used) = best?;
    if v.is_nan() {
        return None;
    }
    let rest = t[used..].trim_start();
    let mult = match rest.chars().next() {
        None => 1.0,
        Some('G' | 'g') => 1024.0 * 1024.0 * 1024.0,
        Some('M' | 'm') => 1024.0 * 1024.0,
        Some('K' | 'k') => 1024.0,
        Some(_) => return None,
    };
    let total = v * mult;
    if total < 0.0 {
        return None;
    }
    Some(if total >= u64::MAX as f64 {
        u64::MAX
    } else {
        total as u64
    })
}

/// Parses `argv[1..]`.
pub fn parse<S: AsRef<str>>(argv: &[S]) -> Parsed {
    let mut a = Args::default();
    let mut i = 0;
    while i < argv.len() {
        let arg = argv[i].as_ref();
        i += 1;
        if arg == "--" {
            break;
        }
        let (opt, inline): (char, Option<String>) = if let Some(long) = arg.strip_prefix("--") {
            let (name, val) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let exact = OPTS.iter().find(|(_, l)| *l == name);
            let matches: Vec<_> = OPTS.iter().filter(|(_, l)| l.starts_with(name)).collect();
            let found = match (exact, matches.len()) {
                (Some(o), _) => o,
                (None, 1) => matches[0],
                (None, 0) => {
                    return Parsed::Usage {
                        note: Some(format!("unrecognized option '--{name}'")),
                    }
                }
                _ => {
                    return Parsed::Usage {
                        note: Some(format!("option '--{name}' is ambiguous")),
                    }
                }
            };
            if found.0 == 'h' {
                return Parsed::Usage { note: None };
            }
            (found.0, val)
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let c = short.chars().next().unwrap_or('?');
            if !OPTS.iter().any(|(s, _)| *s == c) {
                return Parsed::Usage {
                    note: Some(format!("invalid option -- '{c}'")),
                };
            }
            if c == 'h' {
                return Parsed::Usage { note: None };
            }
            let rest = &short[c.len_utf8()..];
            (
                c,
                if rest.is_empty() {
                    None
                } else {
                    Some(rest.to_string())
                },
            )
        } else {
            // Non-option arguments are ignored, as nccl-tests does.
            continue;
        };
        let val = match inline {
            Some(v) => v,
            None => match argv.get(i) {
                Some(v) => {
                    i += 1;
                    v.as_ref().to_string()
                }
                None => {
                    return Parsed::Usage {
                        note: Some(format!("option requires an argument -- '{opt}'")),
                    }
                }
            },
        };
        if let Err(p) = apply(&mut a, opt, &val) {
            return p;
        }
    }
    validate(a)
}

fn apply(a: &mut Args, opt: char, val: &str) -> Result<(), Parsed> {
    let n = || strtol(val);
    let size = |what: &str| {
        parse_size(val).ok_or_else(|| Parsed::Fail {
            code: 255,
            message: format!("invalid size specified for '{what}'"),
        })
    };
    match opt {
        't' => a.nthreads = n(),
        'g' => a.ngpus = n(),
        'b' => a.min_bytes = size("minbytes")?,
        'e' => a.max_bytes = size("maxbytes")?,
        'i' => a.step_bytes = size("stepbytes")?,
        'f' => a.step_factor = n().max(0) as u64,
        'n' => a.iters = n(),
        'm' => a.agg_iters = n(),
        'w' => a.warmup_iters = n(),
        'N' => a.run_cycles = n(),
        'p' => a.parallel_init = n(),
        'c' => a.check = n(),
        'o' => {
            a.op = if val == "all" {
                Choice::All
            } else {
                Choice::One(RedOp::parse(val).ok_or_else(|| Parsed::Fail {
                    code: 6,
                    message: format!("invalid op '{val}' (sum/prod/max/min/avg/mulsum/all)"),
                })?)
            }
        }
        'd' => {
            a.dtype = if val == "all" {
                Choice::All
            } else {
                Choice::One(DataType::parse(val).ok_or_else(|| Parsed::Fail {
                    code: 6,
                    message: format!(
                        "invalid type '{val}' (int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2 all)"
                    ),
                })?)
            }
        }
        'r' => {
            let r = n();
            a.root = if r == -1 { Choice::All } else { Choice::One(r) }
        }
        'z' => a.blocking = n(),
        'y' => a.stream_null = n(),
        'T' => a.timeout = n(),
        'G' => a.cudagraph = n(),
        'C' => a.report_cputime = n(),
        'S' => a.report_timestamps = n(),
        'J' => a.output_file = Some(val.to_string()),
        'a' => a.average = n(),
        'R' => a.local_register = n(),
        'u' => a.unalign = n(),
        'I' => a.per_iter_timing = n(),
        'K' => a.per_iter_skip = n(),
        'M' => a.memory = n(),
        _ => {
            return Err(Parsed::Usage {
                note: Some(format!("invalid option -- '{opt}'")),
            })
        }
    }
    Ok(())
}

fn fail6(message: String) -> Parsed {
    Parsed::Fail { code: 6, message }
}

fn validate(a: Args) -> Parsed {
    if a.min_bytes > a.max_bytes {
        return Parsed::Fail {
            code: 255,
            message: format!(
                "invalid sizes for 'minbytes' and 'maxbytes': {} > {}",
                a.min_bytes, a.max_bytes
            ),
        };
    }
    let checks: [(bool, String); 12] = [
        (
            a.nthreads < 1,
            format!("invalid number of threads: {}", a.nthreads),
        ),
        (
            a.ngpus < 1,
            format!("invalid number of GPUs per thread: {}", a.ngpus),
        ),
        (a.iters < 1, format!("invalid iteration count: {}", a.iters)),
        (
            a.agg_iters < 1,
            format!("invalid aggregated iteration count: {}", a.agg_iters),
        ),
        (
            a.warmup_iters < 0,
            format!("invalid warmup iteration count: {}", a.warmup_iters),
        ),
        (
            a.run_cycles < 0,
            format!("invalid run cycle count: {}", a.run_cycles),
        ),
        (
            a.check < 0,
            format!("invalid check iteration count: {}", a.check),
        ),
        (
            !(0..=3).contains(&a.average),
            format!("invalid average mode: {} (0/1/2/3)", a.average),
        ),
        (
            !(0..=3).contains(&a.blocking),
            format!("invalid blocking mode: {} (0/1/2/3)", a.blocking),
        ),
        (a.timeout < 0, format!("invalid timeout: {}", a.timeout)),
        (
            a.step_factor <= 1 && a.step_bytes == 0 && a.min_bytes < a.max_bytes,
            "step bytes must be > 0 when the step factor is 1".to_string(),
        ),
        (
            matches!(a.root, Choice::One(r) if r < -1),
            format!("invalid root: {:?}", a.root),
        ),
    ];
    for (bad, msg) in checks {
        if bad {
            return fail6(msg);
        }
    }
    if a.unalign < 0 || a.per_iter_skip < 0 {
        return fail6("unalign and per_iter_skip must be >= 0".to_string());
    }
    if let Some(f) = &a.output_file {
        if !f.ends_with(".json") {
            return fail6(format!("output file '{f}': only .json output is supported"));
        }
    }
    Parsed::Run(Box::new(a))
}

/// The sizes one cycle iterates: min, then *factor (factor > 1) or +step.
pub fn sizes(a: &Args) -> Vec<u64> {
    let mut v = Vec::new();
    let mut s = a.min_bytes;
    loop {
        v.push(s);
        let next = if a.step_factor > 1 {
            if s == 0 {
                // nccl-tests would loop forever on 0 * factor; we stop.
                break;
            }
            s.checked_mul(a.step_factor)
        } else {
            s.checked_add(a.step_bytes)
        };
        match next {
            Some(n) if n <= a.max_bytes && n != s => s = n,
            _ => break,
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Args {
        match parse(args) {
            Parsed::Run(a) => *a,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let a = run(&[]);
        assert_eq!(a, Args::default());
        assert_eq!(a.min_bytes, 32 << 20);
        assert_eq!(a.warmup_iters, 1);
        assert_eq!(a.iters, 20);
        assert_eq!(sizes(&a), vec![32 << 20]);
    }

    #[test]
    fn short_long_and_attached_forms() {
        let a = run(&[
            "-b8",
            "-e",
            "128M",
            "--stepfactor",
            "2",
            "--iters=5",
            "-w",
            "0",
            "--check=3",
            "-t",
            "2",
            "-g2",
        ]);
        assert_eq!(
            (
                a.min_bytes,
                a.max_bytes,
                a.step_factor,
                a.iters,
                a.warmup_iters,
                a.check
            ),
            (8, 128 << 20, 2, 5, 0, 3)
        );
        assert_eq!((a.nthreads, a.ngpus), (2, 2));
        assert_eq!(sizes(&a).len(), 25);
        let b = run(&["--minb", "1K", "--maxbytes", "4k", "-i", "1024"]);
        assert_eq!(sizes(&b), vec![1024, 2048, 3072, 4096]);
        let c = run(&["-o", "all", "-d", "bfloat16", "-r", "-1", "-J", "x.json"]);
        assert_eq!(
            (c.op, c.dtype, c.root),
            (Choice::All, Choice::One(DataType::Bfloat16), Choice::All)
        );
        assert_eq!(c.output_file.as_deref(), Some("x.json"));
        let d = run(&["-T", "0x10", "-n", "010", "-a", "3", "ignored-positional"]);
        assert_eq!((d.timeout, d.iters, d.average), (16, 8, 3));
    }

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("1.5K"), Some(1536));
        assert_eq!(parse_size("2 G"), Some(2 << 30));
        assert_eq!(parse_size("8KB"), Some(8192));
        assert_eq!(parse_size("1e3"), Some(1000));
        assert_eq!(parse_size("8X"), None);
        assert_eq!(parse_size("abc"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("-5"), None);
    }

    #[test]
    fn strtol_semantics() {
        assert_eq!(strtol("12abc"), 12);
        assert_eq!(strtol("abc"), 0);
        assert_eq!(strtol(" -7"), -7);
        assert_eq!(strtol("0x1f"), 31);
        assert_eq!(strtol("017"), 15);
        assert_eq!(strtol("99999999999999999999999"), i64::MAX);
    }

    #[test]
    fn usage_and_errors() {
        assert_eq!(parse(&["-h"]), Parsed::Usage { note: None });
        assert_eq!(parse(&["--help"]), Parsed::Usage { note: None });
        assert!(matches!(parse(&["-x"]), Parsed::Usage { note: Some(_) }));
        assert!(matches!(
            parse(&["--bogus", "1"]),
            Parsed::Usage { note: Some(_) }
        ));
        assert!(matches!(parse(&["-b"]), Parsed::Usage { note: Some(_) }));
        assert!(matches!(
            parse(&["--m", "1"]),
            Parsed::Usage { note: Some(_) }
        )); // ambiguous
        let code = |args: &[&str]| match parse(args) {
            Parsed::Fail { code, .. } => code,
            other => panic!("{args:?}: {other:?}"),
        };
        assert_eq!(code(&["-b", "1M", "-e", "1K"]), 255);
        assert_eq!(code(&["-b", "huge"]), 255);
        assert_eq!(code(&["-e", "12Q"]), 255);
        assert_eq!(code(&["-t", "0"]), 6);
        assert_eq!(code(&["-g", "abc"]), 6);
        assert_eq!(code(&["-n", "0"]), 6);
        assert_eq!(code(&["-o", "xor"]), 6);
        assert_eq!(code(&["-d", "quad"]), 6);
        assert_eq!(code(&["-a", "4"]), 6);
        assert_eq!(code(&["-z", "9"]), 6);
        assert_eq!(code(&["-J", "out.txt"]), 6);
        assert_eq!(code(&["-b", "1K", "-e", "2K", "-i", "0"]), 6);
        assert_eq!(code(&["-r", "-2"]), 6);
        assert!(usage("all_reduce_perf")
            .starts_with("USAGE: all_reduce_perf \n\t[-t,--nthreads <num threads>] \n\t"));
    }
}
