//! CPU starvation metric: how long the threads running a rank's operations were runnable
//! but not running (Linux schedstat's run-queue delay).
//!
//! On the host backend communication is CPU work, so a rank starved of CPU (a competing
//! process on its cores, too many threads per core) is slow inside every operation and its
//! peers wait for it. Its own wait metrics do not show it: while descheduled it looks like
//! a rank waiting for its peers. The scheduler knows better: `/proc/self/task/<tid>/schedstat`
//! holds the thread's cumulative time on a CPU, its cumulative run-queue delay and its
//! number of time slices. The diagnostic thread reads the delay of the thread that ran each
//! rank's latest operation every [`SCHED_SAMPLE`] and accumulates its growth per rank
//! ([`CpuWaitTracker`]); records carry the total (`OpRecord.cpu_wait_ns`) and the analyzer
//! turns its growth over a window into a share of time.
//!
//! The same file tells a second thing: when the whole process was **frozen**, neither
//! running nor runnable nor sleeping by choice (SIGSTOP, a debugger, a cgroup freezer,
//! heavy swapping). Such a rank holds its peers back while none of its own metrics move,
//! and when the stops are short and intermittent (a SIGSTOP/SIGCONT duty cycle) they fall
//! inside operations and show as no entry skew. The diagnostic thread parks for a known
//! period; an overshoot of the park that its own run-queue delay and CPU time do not
//! explain is time the process was frozen ([`frozen_in`], [`FrozenClock`]). Records carry
//! the process's total (`OpRecord.frozen_ns`).

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// How often the diagnostic thread reads the run-queue delays (one `pread` per thread that
/// runs operations).
pub const SCHED_SAMPLE: Duration = Duration::from_millis(50);

/// One reading of a thread's schedstat: cumulative time on a CPU and run-queue delay (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedTimes {
    pub on_cpu: u64,
    pub run_delay: u64,
}

/// The times of a schedstat line `"<on-cpu ns> <delay ns> <slices>"`; `None` for anything
/// else.
pub fn parse_sched_times(text: &str) -> Option<SchedTimes> {
    let mut it = text.split_ascii_whitespace();
    let on_cpu: u64 = it.next()?.parse().ok()?;
    let run_delay: u64 = it.next()?.parse().ok()?;
    let _slices: u64 = it.next()?.parse().ok()?;
    Some(SchedTimes { on_cpu, run_delay })
}

/// The run-queue delay (ns, second field) of a schedstat line; `None` for anything else.
pub fn parse_run_delay(text: &str) -> Option<u64> {
    parse_sched_times(text).map(|t| t.run_delay)
}

/// Part of a park overshoot that is never counted as frozen: timer slack, the schedstat
/// read itself and short kernel waits (a page fault) stay below it.
pub const FROZEN_SLACK_NS: u64 = 1_000_000;

/// Time (ns) a thread that asked to park for `parked_ns` and came back `wall_ns` later was
/// frozen: the wall time that neither the park, nor its time on a CPU, nor its time waiting
/// for one (`before` .. `after`) accounts for, less [`FROZEN_SLACK_NS`]. An early wake-up
/// (`wall_ns < parked_ns`) or a reading that went backwards gives 0.
pub fn frozen_in(wall_ns: u64, parked_ns: u64, before: SchedTimes, after: SchedTimes) -> u64 {
    let ran = after.on_cpu.saturating_sub(before.on_cpu);
    let queued = after.run_delay.saturating_sub(before.run_delay);
    wall_ns.saturating_sub(
        parked_ns
            .saturating_add(ran)
            .saturating_add(queued)
            .saturating_add(FROZEN_SLACK_NS),
    )
}

/// The process's accumulated frozen time, measured around the diagnostic thread's parks:
/// [`FrozenClock::before_park`] just before it parks, [`FrozenClock::after_park`] when it
/// is back. Only an overshoot beyond [`FROZEN_SLACK_NS`] costs a second schedstat read.
pub struct FrozenClock {
    file: Option<StatFile>,
    mark: Option<(std::time::Instant, SchedTimes)>,
    total: u64,
    known: bool,
}

impl FrozenClock {
    /// A clock over the calling thread's schedstat (unknown where it cannot be read).
    pub fn for_current_thread() -> FrozenClock {
        FrozenClock {
            file: StatFile::open(current_tid()),
            mark: None,
            total: 0,
            known: false,
        }
    }

    /// Reads the thread's times just before a park.
    pub fn before_park(&mut self) {
        self.mark = self
            .file
            .as_ref()
            .and_then(StatFile::times)
            .map(|t| (std::time::Instant::now(), t));
    }

    /// Accounts the park that [`FrozenClock::before_park`] preceded, which asked for
    /// `parked`.
    pub fn after_park(&mut self, parked: Duration) {
        let Some((t0, before)) = self.mark.take() else {
            return;
        };
        self.known = true;
        let wall = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let parked = u64::try_from(parked.as_nanos()).unwrap_or(u64::MAX);
        if wall <= parked.saturating_add(FROZEN_SLACK_NS) {
            return;
        }
        if let Some(after) = self.file.as_ref().and_then(StatFile::times) {
            self.total = self
                .total
                .saturating_add(frozen_in(wall, parked, before, after));
        }
    }

    /// The accumulated frozen time (ns), `None` before the first measured park.
    pub fn total(&self) -> Option<u64> {
        self.known.then_some(self.total)
    }
}

/// The calling thread's kernel thread id (cached per thread: one system call per thread).
pub fn current_tid() -> i32 {
    thread_local! {
        static TID: Cell<i32> = const { Cell::new(0) };
    }
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid takes no argument, cannot fail and touches no memory.
            t.set(unsafe { libc::gettid() });
        }
        t.get()
    })
}

/// An open schedstat file of one thread of this process.
struct StatFile {
    file: File,
}

impl StatFile {
    fn open(tid: i32) -> Option<StatFile> {
        File::open(format!("/proc/self/task/{tid}/schedstat"))
            .ok()
            .map(|file| StatFile { file })
    }

    /// The thread's cumulative times now (`None`: unreadable, thread gone).
    fn times(&self) -> Option<SchedTimes> {
        let mut buf = [0u8; 96];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        parse_sched_times(std::str::from_utf8(&buf[..n]).ok()?)
    }

    /// The thread's cumulative run-queue delay now (`None`: unreadable, thread gone).
    fn run_delay(&self) -> Option<u64> {
        self.times().map(|t| t.run_delay)
    }
}

/// Per rank: the thread last seen running its operations, that thread's delay at the last
/// reading, and the rank's accumulated delay.
#[derive(Clone, Copy, Debug, Default)]
struct RankTrack {
    tid: i32,
    last_delay: Option<u64>,
    total: u64,
    known: bool,
}

/// Accumulates each rank's CPU wait across the threads that run its operations. Pure
/// bookkeeping in [`CpuWaitTracker::update`]; the file reads are in [`CpuWaitTracker::sample`].
#[derive(Default)]
pub struct CpuWaitTracker {
    ranks: HashMap<u64, RankTrack>,
    files: HashMap<i32, StatFile>,
}

impl CpuWaitTracker {
    /// Accounts one reading for rank `key`: thread `tid` had cumulative delay `delay`. A
    /// change of thread starts a new baseline (the interval in between is not counted).
    pub fn update(&mut self, key: u64, tid: i32, delay: Option<u64>) {
        let r = self.ranks.entry(key).or_default();
        match (r.tid == tid, r.last_delay, delay) {
            (true, Some(a), Some(b)) => {
                r.total = r.total.saturating_add(b.saturating_sub(a));
                r.known = true;
            }
            (_, _, Some(_)) => r.known = true,
            _ => {}
        }
        r.tid = tid;
        r.last_delay = delay;
    }

    /// Reads the delay of each `(rank key, tid)` (tid 0: no operation ran yet) and
    /// accounts it; threads no longer named are forgotten (their files closed).
    pub fn sample(&mut self, threads: &[(u64, i32)]) {
        self.files
            .retain(|tid, _| threads.iter().any(|(_, t)| t == tid));
        self.ranks
            .retain(|k, _| threads.iter().any(|(key, _)| key == k));
        for &(key, tid) in threads {
            if tid == 0 {
                continue;
            }
            let delay = match self.files.entry(tid) {
                std::collections::hash_map::Entry::Occupied(e) => e.get().run_delay(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    StatFile::open(tid).and_then(|f| e.insert(f).run_delay())
                }
            };
            if delay.is_none() {
                self.files.remove(&tid);
            }
            self.update(key, tid, delay);
        }
    }

    /// Rank `key`'s accumulated CPU wait (ns), `None` before its first successful reading.
    pub fn total(&self, key: u64) -> Option<u64> {
        self.ranks.get(&key).filter(|r| r.known).map(|r| r.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines_parse_and_junk_does_not() {
        assert_eq!(parse_run_delay("153941 3411122 2\n"), Some(3_411_122));
        assert_eq!(parse_run_delay("1 2"), None);
        assert_eq!(parse_run_delay("a 2 3"), None);
        assert_eq!(parse_run_delay(""), None);
        assert_eq!(parse_run_delay("1 -2 3"), None);
    }

    #[test]
    fn frozen_time_is_the_park_overshoot_that_scheduling_does_not_explain() {
        let t = |on_cpu, run_delay| SchedTimes { on_cpu, run_delay };
        assert_eq!(
            parse_sched_times("153941 3411122 2\n"),
            Some(t(153_941, 3_411_122))
        );
        let ms = 1_000_000;
        // Parked 10 ms, back after 70: 2 ms on a CPU, 5 ms waiting for one, 1 ms slack.
        assert_eq!(
            frozen_in(70 * ms, 10 * ms, t(0, 0), t(2 * ms, 5 * ms)),
            52 * ms
        );
        // Back late only because the CPU was busy: not frozen.
        assert_eq!(frozen_in(40 * ms, 10 * ms, t(0, 0), t(0, 30 * ms)), 0);
        // Early wake-up, within the slack, or a reading that went backwards.
        assert_eq!(frozen_in(3 * ms, 10 * ms, t(0, 0), t(0, 0)), 0);
        assert_eq!(frozen_in(10 * ms + ms / 2, 10 * ms, t(0, 0), t(0, 0)), 0);
        assert_eq!(frozen_in(20 * ms, 10 * ms, t(5, 5), t(0, 0)), 9 * ms);
        assert_eq!(
            frozen_in(u64::MAX, u64::MAX, t(0, 0), t(u64::MAX, u64::MAX)),
            0
        );
    }

    /// Runs this test binary's `frozen_clock_child` in a child process for `run_ms`; when
    /// `stop_ms` is set, stops it with SIGSTOP for that long once it is parking. Returns
    /// the child's measured frozen time (ns).
    fn child_frozen_ns(run_ms: u64, stop_ms: Option<u64>) -> u64 {
        use std::io::{BufRead, BufReader};
        let exe = std::env::current_exe().expect("test binary");
        let mut child = std::process::Command::new(exe)
            .args([
                "--exact",
                "sched::tests::frozen_clock_child",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CCLD_TEST_FROZEN_CHILD_MS", run_ms.to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn child");
        let pid = child.id() as i32;
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut frozen = None;
        for line in lines.by_ref() {
            let line = line.expect("child output");
            // libtest prints "test <name> ... " before the test's own output.
            if line.ends_with("READY") {
                if let Some(ms) = stop_ms {
                    // SAFETY: kill with a valid signal on our own child's pid.
                    unsafe { libc::kill(pid, libc::SIGSTOP) };
                    std::thread::sleep(Duration::from_millis(ms));
                    // SAFETY: kill with a valid signal on our own child's pid.
                    unsafe { libc::kill(pid, libc::SIGCONT) };
                }
            } else if let Some((_, v)) = line.split_once("FROZEN_NS=") {
                frozen = v.trim().parse().ok();
            }
        }
        assert!(child.wait().expect("child exit").success());
        frozen.expect("the child printed its frozen time")
    }

    /// The child side of [`child_frozen_ns`] (does nothing unless started by it).
    #[test]
    #[ignore = "child process of a_stopped_process_measures_its_frozen_time"]
    fn frozen_clock_child() {
        let Some(ms) = std::env::var(ccl_params::CCLD_TEST_FROZEN_CHILD_MS.name)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        else {
            return;
        };
        let period = Duration::from_millis(10);
        let mut clock = FrozenClock::for_current_thread();
        let end = std::time::Instant::now() + Duration::from_millis(ms);
        let mut ready = false;
        while std::time::Instant::now() < end {
            clock.before_park();
            if !ready {
                println!("READY");
                ready = true;
            }
            std::thread::park_timeout(period);
            clock.after_park(period);
        }
        println!("FROZEN_NS={}", clock.total().expect("schedstat readable"));
    }

    #[test]
    fn a_stopped_process_measures_its_frozen_time() {
        if std::fs::metadata("/proc/self/schedstat").is_err() {
            eprintln!("skipped: no schedstat on this kernel");
            return;
        }
        let ms = 1_000_000u64;
        // Stopped for 500 ms: at most one 10 ms park of it overlaps the stop, plus slack.
        let stopped = child_frozen_ns(1200, Some(500));
        assert!(
            (480 * ms..=620 * ms).contains(&stopped),
            "stopped 500 ms, measured {} ms",
            stopped / ms
        );
        let running = child_frozen_ns(600, None);
        assert!(
            running < 100 * ms,
            "never stopped, measured {} ms",
            running / ms
        );
    }

    #[test]
    fn growth_accumulates_per_thread_and_a_new_thread_rebaselines() {
        let mut t = CpuWaitTracker::default();
        t.update(1, 10, Some(100));
        assert_eq!(t.total(1), Some(0));
        t.update(1, 10, Some(350));
        assert_eq!(t.total(1), Some(250));
        // Another thread runs the rank's operations now: its own history is not ours.
        t.update(1, 11, Some(9_000));
        assert_eq!(t.total(1), Some(250));
        t.update(1, 11, Some(9_100));
        assert_eq!(t.total(1), Some(350));
        // Unreadable: no growth, next reading rebaselines.
        t.update(1, 11, None);
        t.update(1, 11, Some(9_500));
        assert_eq!(t.total(1), Some(350));
        assert_eq!(t.total(2), None);
    }

    #[test]
    fn a_thread_kept_off_the_cpu_accumulates_run_queue_delay() {
        // This thread and a competitor pinned to one CPU: whichever is not running waits.
        if std::fs::metadata("/proc/self/schedstat").is_err() {
            eprintln!("skipped: no schedstat on this kernel");
            return;
        }
        let tid = current_tid();
        assert_eq!(tid, current_tid(), "cached");
        let mut t = CpuWaitTracker::default();
        t.sample(&[(7, tid)]);
        assert_eq!(t.total(7), Some(0));
        let cpu = {
            // SAFETY: sched_getcpu has no arguments and no memory effects.
            unsafe { libc::sched_getcpu() }
        };
        let pin = |c: i32| {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
            // sched_setaffinity get valid pointers and the set's size.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(c as usize, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
            }
        };
        if cpu < 0 || pin(cpu) != 0 {
            eprintln!("skipped: cannot pin");
            return;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = std::sync::Arc::clone(&stop);
        let competitor = std::thread::spawn(move || {
            // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it (cpu
            // is below CPU_SETSIZE: it came from sched_getcpu); sched_setaffinity(0, ...)
            // reads `size_of` bytes of it for the calling thread.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu as usize, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            std::hint::spin_loop();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        competitor.join().expect("competitor");
        t.sample(&[(7, tid)]);
        let waited = t.total(7).expect("readable");
        // Sharing one CPU for 300 ms: this thread waited for it for a good part of that.
        assert!(waited >= 50_000_000, "run-queue delay {waited} ns");
    }
}
