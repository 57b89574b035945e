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

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// How often the diagnostic thread reads the run-queue delays (one `pread` per thread that
/// runs operations).
pub const SCHED_SAMPLE: Duration = Duration::from_millis(50);

/// The run-queue delay (ns, second field) of a schedstat line `"<on-cpu ns> <delay ns>
/// <slices>"`; `None` for anything else.
pub fn parse_run_delay(text: &str) -> Option<u64> {
    let mut it = text.split_ascii_whitespace();
    let _on_cpu: u64 = it.next()?.parse().ok()?;
    let delay: u64 = it.next()?.parse().ok()?;
    let _slices: u64 = it.next()?.parse().ok()?;
    Some(delay)
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

    /// The thread's cumulative run-queue delay now (`None`: unreadable, thread gone).
    fn run_delay(&self) -> Option<u64> {
        let mut buf = [0u8; 96];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        parse_run_delay(std::str::from_utf8(&buf[..n]).ok()?)
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
            // SAFETY: as above.
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
