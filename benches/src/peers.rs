//! Shared pieces of the side-by-side benchmarks (issue 18): running our `all_reduce_perf`
//! as processes under `ccl-run`, the same minimal timing loop over ncclAllReduce
//! (`benches/c/nccl_allreduce.c`) and over MPI_Allreduce (the OpenMPI peer,
//! `benches/c/mpi_allreduce.c`, under `mpirun`), parsing the outputs, the machine's memcpy
//! bandwidth and cross-core round trip, medians.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use nccl_tests_compat::ccl_run::allowed_cpus;

/// One measured size: bytes, time per operation (us), bus bandwidth (GB/s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// Message size in bytes.
    pub bytes: u64,
    /// Time per operation in microseconds.
    pub time_us: f64,
    /// Bus bandwidth in GB/s (nccl-tests' AllReduce formula: algbw x 2(n-1)/n).
    pub busbw: f64,
}

/// Median of `v` (mean of the two middle values for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// Lower quartile, median and upper quartile of `v` (the quartiles are the medians of the
/// lower and upper halves, the middle value excluded for an odd count; Tukey's hinges);
/// `None` when empty.
pub fn quartiles(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let half = s.len() / 2;
    let upper = &s[s.len() - half..];
    if half == 0 {
        return Some((s[0], s[0], s[0]));
    }
    Some((median(&s[..half]), median(&s), median(upper)))
}

/// Parses the data lines of an nccl-tests table (ours or NVIDIA's): the out-of-place
/// columns `size count type redop root time algbw busbw #wrong ...`. Other lines are
/// skipped. Errors when a data line carries a non-zero `#wrong`.
pub fn parse_nccl_tests(out: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 || f[0].starts_with('#') {
            continue;
        }
        let (Ok(bytes), Ok(time_us), Ok(busbw)) = (
            f[0].parse::<u64>(),
            f[5].parse::<f64>(),
            f[7].parse::<f64>(),
        ) else {
            continue;
        };
        if f[8] != "0" && f[8] != "N/A" {
            return Err(format!("wrong results reported: {line}"));
        }
        rows.push(Row {
            bytes,
            time_us,
            busbw,
        });
    }
    Ok(rows)
}

/// AllReduce bus bandwidth (GB/s) of `bytes` in `time_us` over `ranks` ranks, the
/// nccl-tests formula; used instead of the table's two-decimal column, which reads 0.00
/// for small sizes.
pub fn allreduce_busbw(bytes: u64, time_us: f64, ranks: usize) -> f64 {
    let n = ranks as f64;
    bytes as f64 / (time_us * 1e3) * 2.0 * (n - 1.0) / n
}

/// Parses the MPI peer's output lines `bytes time_us busbw`.
pub fn parse_mpi(out: &str) -> Vec<Row> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [b, t, bw] => Some(Row {
                    bytes: b.parse().ok()?,
                    time_us: t.parse().ok()?,
                    busbw: bw.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

/// Where our binaries are (`target/release` next to this executable by default).
pub fn release_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target/release"))
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

/// Our AllReduce (sum), `ranks` local processes under `ccl-run`, sizes `min..=max` by
/// `factor`, `-c 1` (every size verified), `iters` timed iterations after 5 warm-up ones.
pub fn run_ours(
    dir: &Path,
    ranks: usize,
    (min, max, factor): (u64, u64, u64),
    dtype: &str,
    iters: u32,
) -> Result<Vec<Row>, String> {
    let out = run(Command::new(dir.join("ccl-run"))
        .arg("-n")
        .arg(ranks.to_string())
        .arg(dir.join("all_reduce_perf"))
        .args(["-b", &min.to_string(), "-e", &max.to_string()])
        .args(["-f", &factor.to_string(), "-d", dtype, "-o", "sum"])
        .args(["-c", "1", "-w", "5", "-n", &iters.to_string()])
        .env("LD_LIBRARY_PATH", dir))?;
    allreduce_rows(&out, ranks)
}

/// The rows of an `all_reduce_perf` output over `ranks` ranks, busbw recomputed with
/// [`allreduce_busbw`]; an error without any row or with wrong results.
pub fn allreduce_rows(out: &str, ranks: usize) -> Result<Vec<Row>, String> {
    let mut rows = parse_nccl_tests(out)?;
    for r in &mut rows {
        r.busbw = allreduce_busbw(r.bytes, r.time_us, ranks);
    }
    if rows.is_empty() {
        return Err(format!("no result lines from all_reduce_perf:\n{out}"));
    }
    Ok(rows)
}

/// The OpenMPI peer (`mpi_bin`, built from `benches/c/mpi_allreduce.c`): float-sum
/// `MPI_Allreduce`, `ranks` processes under `mpirun`, same sizes and iteration counts.
pub fn run_mpi(
    mpirun: &str,
    mpi_bin: &Path,
    ranks: usize,
    range: (u64, u64, u64),
    iters: u32,
) -> Result<Vec<Row>, String> {
    let out = run(Command::new(mpirun)
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(ranks.to_string())
        .args(["--mca", "btl", "self,vader"])
        .arg(mpi_bin)
        .args(loop_args(range, iters)))?;
    loop_rows(&out, mpi_bin)
}

/// Runs `benches/c/nccl_allreduce.c` (built at `bin` against NVIDIA's `nccl.h`) on the
/// `libnccl.so.2` in `lib_dir`: the same loop and output as the MPI peer, so that both
/// libraries are timed alike, without the nccl-tests harness's per-call work.
pub fn run_c_loop(
    bin: &Path,
    lib_dir: &Path,
    ranks: usize,
    range: (u64, u64, u64),
    iters: u32,
) -> Result<Vec<Row>, String> {
    let out = run(Command::new(bin)
        .arg(ranks.to_string())
        .args(loop_args(range, iters))
        .env("LD_LIBRARY_PATH", lib_dir))?;
    loop_rows(&out, bin)
}

/// The size range and iteration counts of both timing loops: MINBYTES MAXBYTES FACTOR
/// ITERS WARMUP (5 warm-up operations, as `run_ours` asks of `all_reduce_perf`).
fn loop_args((min, max, factor): (u64, u64, u64), iters: u32) -> [String; 5] {
    [min, max, factor, u64::from(iters), 5].map(|v| v.to_string())
}

/// The rows of a timing loop's output ([`parse_mpi`]); an error when there are none.
fn loop_rows(out: &str, bin: &Path) -> Result<Vec<Row>, String> {
    let rows = parse_mpi(out);
    if rows.is_empty() {
        return Err(format!("no result lines from {}:\n{out}", bin.display()));
    }
    Ok(rows)
}

/// The machine's memcpy bandwidth at `bytes` (GB/s, bytes copied per second): median of
/// `reps` timed batches, each copying a touched buffer into another enough times to last
/// about 2 ms. Both buffers start at the same offset in a page ([`page_apart`]): glibc's
/// `memcpy` copies 4 KiB to a few hundred KiB with `rep movsb`, which AMD EPYC (the
/// development VM) runs at about 3 GB/s instead of 40-90 when the destination lies 1 to
/// 31 bytes past the source modulo 4 KiB, and two heap vectors allocated one after the
/// other land exactly there (16 bytes of allocator header apart); that measured this
/// alignment, not the machine.
pub fn memcpy_gbps(bytes: usize, reps: usize) -> f64 {
    let n = bytes.max(1);
    let mut buf = vec![0u8; 2 * n + 2 * PAGE];
    let (src, dst) = page_apart(&mut buf, n);
    src.fill(1);
    dst.fill(2);
    let per = (2_000_000 / (bytes / 1000 + 1)).clamp(1, 100_000);
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..per {
            dst.copy_from_slice(std::hint::black_box(&*src));
            std::hint::black_box(&mut *dst);
        }
        v.push((bytes * per) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    median(&v)
}

const PAGE: usize = 4096;

/// Round trips per timed run of [`core_round_trip_ns`].
const ROUND_TRIPS: u64 = 20_000;

/// How long one run of [`core_round_trip_ns`] may take before it gives up (a thread that
/// does not get its CPU).
const ROUND_TRIP_LIMIT: Duration = Duration::from_secs(2);

/// A counter on a cache line of its own.
#[repr(align(128))]
struct Line(AtomicU64);

/// Binds thread `tid` of this process (0: the calling thread) to `cpu`; whether that
/// worked.
pub fn pin_thread(tid: libc::pid_t, cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it (cpu <
    // CPU_SETSIZE, checked above), sched_setaffinity only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The time a cache line takes to go from one CPU to another and back (nanoseconds,
/// median of `runs` runs of 20,000 round trips): two threads, bound to the first two CPUs
/// the calling thread may run on, hand a counter back and forth. It is the least a message
/// between two ranks on different cores costs, and on a virtual machine it changes with
/// where the host runs the virtual CPUs: the 2-core development VM gave 550 ns, 79 ns and
/// 455-586 ns within ten minutes on 2026-12-06, and the small-message figures of both
/// libraries moved with it. The benchmarks print it next to their tables. `None` with
/// fewer than two CPUs allowed, when a thread cannot be bound, or when a run takes over
/// 2 s.
pub fn core_round_trip_ns(runs: usize) -> Option<f64> {
    let cpus = allowed_cpus();
    let (&a, &b) = (cpus.first()?, cpus.get(1)?);
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        v.push(round_trip_run(a, b, ROUND_TRIPS, ROUND_TRIP_LIMIT)?);
    }
    Some(median(&v))
}

/// [`core_round_trip_ns`] (5 runs) as the benchmarks print it: "123 ns", or "?" where it
/// cannot be measured.
pub fn core_round_trip_text() -> String {
    core_round_trip_ns(5).map_or_else(|| "?".into(), |ns| format!("{ns:.0} ns"))
}

/// One run of [`core_round_trip_ns`] between CPUs `a` and `b`: `trips` round trips, given
/// up after `limit`; nanoseconds per round trip.
fn round_trip_run(a: usize, b: usize, trips: u64, limit: Duration) -> Option<f64> {
    let ball = Line(AtomicU64::new(0));
    let failed = AtomicBool::new(false);
    // Side `first` moves the ball from 2i to 2i+1, the other from 2i+1 to 2i+2. Either side
    // gives up when the other failed, or when the run is past its limit.
    let side = |cpu: usize, first: bool| -> Option<Duration> {
        if !pin_thread(0, cpu) {
            failed.store(true, Ordering::Relaxed);
            return None;
        }
        let t = Instant::now();
        let give_up = || {
            let over = failed.load(Ordering::Relaxed) || t.elapsed() > limit;
            if over {
                failed.store(true, Ordering::Relaxed);
            }
            over
        };
        for i in 0..trips {
            let (want, next) = if first {
                (2 * i, 2 * i + 1)
            } else {
                (2 * i + 1, 2 * i + 2)
            };
            // The limit is looked at every 1,024 round trips and every 65,536 polls.
            if i.is_multiple_of(1024) && give_up() {
                return None;
            }
            let mut polls = 0u32;
            while ball.0.load(Ordering::Acquire) != want {
                std::hint::spin_loop();
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(1 << 16) && give_up() {
                    return None;
                }
            }
            ball.0.store(next, Ordering::Release);
        }
        Some(t.elapsed())
    };
    // Both sides on threads of their own: the calling thread keeps its CPUs (processes it
    // starts later inherit them).
    let (ta, tb) = std::thread::scope(|s| {
        let (ha, hb) = (s.spawn(|| side(a, true)), s.spawn(|| side(b, false)));
        (ha.join().ok().flatten(), hb.join().ok().flatten())
    });
    let t = ta?.max(tb?);
    Some(t.as_nanos() as f64 / trips.max(1) as f64)
}

/// Two disjoint `n`-byte slices of `buf` (at least `2 n + 2 PAGE` bytes) that both start
/// on a page boundary, so that their distance is a multiple of 4 KiB.
fn page_apart(buf: &mut [u8], n: usize) -> (&mut [u8], &mut [u8]) {
    let first = (PAGE - buf.as_ptr() as usize % PAGE) % PAGE;
    let second = first + n.div_ceil(PAGE) * PAGE;
    let (a, b) = buf.split_at_mut(second);
    (&mut a[first..first + n], &mut b[..n])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_are_the_medians_of_the_halves() {
        assert_eq!(quartiles(&[]), None);
        assert_eq!(quartiles(&[2.0]), Some((2.0, 2.0, 2.0)));
        // Odd count: the middle value is the median and in neither half.
        assert_eq!(quartiles(&[9.0, 1.0, 5.0, 3.0, 7.0]), Some((2.0, 5.0, 8.0)));
        // Even count: halves of two.
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0]), Some((1.5, 2.5, 3.5)));
        assert_eq!(quartiles(&[1.0, 3.0]), Some((1.0, 2.0, 3.0)));
    }

    #[test]
    fn a_cross_core_round_trip_is_measured_on_two_cpus_and_refused_on_one() {
        let cpus = allowed_cpus();
        if let [a, b, ..] = cpus[..] {
            // Few round trips and a long limit: on a loaded machine (the test suite runs
            // beside other tests) a side may wait a scheduler slice for its CPU.
            let ns = round_trip_run(a, b, 100, Duration::from_secs(60))
                .expect("two CPUs allowed: a figure");
            assert!(ns > 1.0 && ns < 600_000_000.0, "{ns} ns");
            // Past its limit a run gives up instead of spinning on.
            assert_eq!(round_trip_run(a, b, u64::MAX, Duration::ZERO), None);
            // The calling thread keeps the CPUs it had.
            assert_eq!(allowed_cpus(), cpus);
        }
        // A thread allowed one CPU has no second one to measure against.
        let one = std::thread::spawn(move || {
            assert!(pin_thread(0, cpus[0]));
            assert_eq!(allowed_cpus(), vec![cpus[0]]);
            core_round_trip_ns(3)
        });
        assert_eq!(one.join().unwrap(), None);
    }

    #[test]
    fn memcpy_buffers_are_page_aligned_and_disjoint() {
        for n in [1, 8, 4095, 4096, 4097, 131_072] {
            let mut buf = vec![0u8; 2 * n + 2 * PAGE];
            let (a, b) = page_apart(&mut buf, n);
            let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
            assert_eq!((a.len(), b.len()), (n, n));
            assert_eq!((pa % PAGE, pb % PAGE), (0, 0), "n = {n}");
            assert!(pa + n <= pb, "n = {n}: disjoint");
        }
    }

    #[test]
    fn parses_nccl_tests_table_and_rejects_wrong_results() {
        let out = "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n\
                   #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n\
                   \x20          8             2     float     sum      -1    12.50    0.00    0.00      0    11.90    0.00    0.00      0\n\
                   \x20    1048576        262144     float     sum      -1   250.00    4.19    4.19      0   240.00    4.37    4.37      0\n\
                   # Avg bus bandwidth    : 2.1\n";
        let rows = parse_nccl_tests(out).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].bytes, 1_048_576);
        assert_eq!(rows[1].time_us, 250.0);
        assert_eq!(rows[1].busbw, 4.19);
        let bad = out.replace("4.19      0", "4.19      3");
        assert!(parse_nccl_tests(&bad).is_err());
        let mpi = parse_mpi("# comment\n8 3.5 0.002\n1024 10 0.1\n");
        assert_eq!(mpi.len(), 2);
        assert_eq!(mpi[0].bytes, 8);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
