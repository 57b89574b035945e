//! The hub's standby: pure decisions (no I/O) about which process reports the job's
//! incidents.
//!
//! The job's embedded analyzer runs twice: a *primary* hub in the process of the lowest rank
//! that wants one (rank 0, normally) and a *standby* hub in the process of the lowest such
//! rank living in ANOTHER process. Every process sends every batch to both, so both engines
//! see the same records and reach the same diagnoses. Only the *active* hub reports: the
//! primary from the start; the standby once it has seen the primary fail to answer for
//! [`TAKEOVER_AFTER`] (probed every [`PROBE_EVERY`]). A SIGKILLed primary refuses
//! connections, a SIGSTOPped one times out: both are misses.
//!
//! On take-over the standby reports the incidents it detected since the primary last
//! answered ([`Watch::to_report`]): the earlier ones the primary reported itself.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

/// How often the standby probes the primary.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(200);
/// Deadline of one probe (connect + call).
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(400);
/// Uninterrupted failure of the primary after which the standby takes over.
pub(crate) const TAKEOVER_AFTER: Duration = Duration::from_millis(1000);

/// The job's hubs as every rank learns them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hubs {
    /// The hub that reports while it answers.
    pub primary: SocketAddr,
    /// The hub that takes over when the primary stops answering (none when only one
    /// process of the job wants a hub, or the standby could not start).
    pub standby: Option<SocketAddr>,
}

impl Hubs {
    /// The `--server` list of `ccld anomalies`: primary first (the CLI tries the next
    /// address when the first is down).
    pub fn query_list(&self) -> String {
        match self.standby {
            Some(s) => format!("{},{s}", self.primary),
            None => self.primary.to_string(),
        }
    }

    /// Wire form: `primary` or `primary,standby`.
    pub fn encode(&self) -> String {
        self.query_list()
    }

    /// Inverse of [`Self::encode`]; junk is an error naming it.
    pub fn decode(s: &str) -> Result<Hubs, String> {
        let parse = |a: &str| {
            a.parse::<SocketAddr>()
                .map_err(|_| format!("hub address {a:?} is not ip:port"))
        };
        match s.split_once(',') {
            None => Ok(Hubs {
                primary: parse(s)?,
                standby: None,
            }),
            Some((p, q)) => {
                let (p, q) = (parse(p)?, parse(q)?);
                if p == q {
                    return Err(format!("hub list {s:?} names the same hub twice"));
                }
                Ok(Hubs {
                    primary: p,
                    standby: Some(q),
                })
            }
        }
    }
}

impl std::fmt::Display for Hubs {
    /// The [`Hubs::query_list`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.query_list())
    }
}

/// The rank whose process starts the standby: the lowest rank that wants a hub and lives
/// in a process other than `starter`'s. `wants[r]`: rank `r` wants a hub; `procs[r]`: its
/// process identity (host hash, pid). `None` when no other process wants one.
pub(crate) fn standby_rank(wants: &[bool], procs: &[(u64, u32)], starter: usize) -> Option<usize> {
    let home = *procs.get(starter)?;
    (0..wants.len().min(procs.len())).find(|&r| r != starter && wants[r] && procs[r] != home)
}

/// What the standby does after a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep watching; the primary reports.
    Wait,
    /// Take over now (returned once).
    TakeOver,
    /// Already active.
    Active,
}

/// The standby's view of the primary, fed one probe result at a time (times in ns of one
/// clock).
#[derive(Clone, Debug)]
pub struct Watch {
    after_ns: u64,
    last_ok_ns: u64,
    failing_since: Option<u64>,
    active: bool,
}

impl Watch {
    /// A watch started at `now_ns` (counted as the primary's last sign of life: it had just
    /// announced itself) that takes over after `after` of uninterrupted failure.
    pub fn new(now_ns: u64, after: Duration) -> Watch {
        Watch {
            after_ns: u64::try_from(after.as_nanos()).unwrap_or(u64::MAX),
            last_ok_ns: now_ns,
            failing_since: None,
            active: false,
        }
    }

    /// Records one probe: `ok` when the primary answered, at `now_ns`.
    pub fn observe(&mut self, ok: bool, now_ns: u64) -> Decision {
        if self.active {
            return Decision::Active;
        }
        if ok {
            self.last_ok_ns = self.last_ok_ns.max(now_ns);
            self.failing_since = None;
            return Decision::Wait;
        }
        let since = *self.failing_since.get_or_insert(now_ns);
        if now_ns.saturating_sub(since) >= self.after_ns {
            self.active = true;
            return Decision::TakeOver;
        }
        Decision::Wait
    }

    /// True once the standby took over.
    pub fn active(&self) -> bool {
        self.active
    }

    /// When the primary last answered.
    pub fn last_ok_ns(&self) -> u64 {
        self.last_ok_ns
    }

    /// Of the incidents the standby detected while waiting (`detected_at_ns` each), the
    /// ones to report on take-over: those detected after the primary last answered (the
    /// primary reported the earlier ones).
    pub fn to_report<T>(&self, held: Vec<T>, detected_at: impl Fn(&T) -> u64) -> Vec<T> {
        held.into_iter()
            .filter(|i| detected_at(i) > self.last_ok_ns)
            .collect()
    }
}

/// Whether this process's hub reports now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// No hub of the job runs here (or its role is not known yet).
    NoHub,
    /// The primary runs here: report.
    Primary,
    /// The standby runs here; `active` once it took over; `last_ok_ns`: when the primary
    /// last answered (analyzer clock).
    Standby {
        /// Took over.
        active: bool,
        /// Primary's last answer.
        last_ok_ns: u64,
    },
}

/// Incidents a hub made, held until its [`Gate`] says whether to report them.
#[derive(Debug)]
pub(crate) struct Outbox<T> {
    held: VecDeque<T>,
    cap: usize,
}

impl<T> Outbox<T> {
    /// Holds at most `cap` incidents (the oldest go first).
    pub(crate) fn new(cap: usize) -> Outbox<T> {
        Outbox {
            held: VecDeque::new(),
            cap,
        }
    }

    /// Takes the hub's new incidents; returns those to report now, in order:
    /// - primary: everything held (made before the role was known) and `new`;
    /// - standby, waiting: nothing (all held);
    /// - standby, active: the held ones made after the primary last answered, and `new`;
    /// - no role yet: nothing (all held).
    pub(crate) fn pass(
        &mut self,
        gate: Gate,
        new: Vec<T>,
        detected_at: impl Fn(&T) -> u64,
    ) -> Vec<T> {
        match gate {
            Gate::Primary => self.held.drain(..).chain(new).collect(),
            Gate::Standby {
                active: true,
                last_ok_ns,
            } => self
                .held
                .drain(..)
                .filter(|i| detected_at(i) > last_ok_ns)
                .chain(new)
                .collect(),
            Gate::NoHub | Gate::Standby { active: false, .. } => {
                self.held.extend(new);
                while self.held.len() > self.cap {
                    self.held.pop_front();
                }
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_standby_takes_over_after_uninterrupted_failure_only() {
        let mut w = Watch::new(0, Duration::from_millis(1000));
        assert_eq!(w.observe(true, 200 * MS), Decision::Wait);
        // 800 ms of failure, then an answer: the count starts over.
        assert_eq!(w.observe(false, 400 * MS), Decision::Wait);
        assert_eq!(w.observe(false, 1200 * MS), Decision::Wait);
        assert_eq!(w.observe(true, 1300 * MS), Decision::Wait);
        assert_eq!(w.last_ok_ns(), 1300 * MS);
        assert_eq!(w.observe(false, 1500 * MS), Decision::Wait);
        assert_eq!(w.observe(false, 2499 * MS), Decision::Wait);
        assert!(!w.active());
        assert_eq!(w.observe(false, 2500 * MS), Decision::TakeOver);
        assert!(w.active());
        // Once active it stays so, even when the primary answers again.
        assert_eq!(w.observe(true, 2600 * MS), Decision::Active);
        assert_eq!(w.observe(false, 9000 * MS), Decision::Active);
        assert_eq!(w.last_ok_ns(), 1300 * MS);
    }

    #[test]
    fn on_take_over_only_incidents_after_the_primarys_last_answer_are_reported() {
        let mut w = Watch::new(0, Duration::from_millis(500));
        w.observe(true, 1000 * MS);
        w.observe(false, 1200 * MS);
        assert_eq!(w.observe(false, 1700 * MS), Decision::TakeOver);
        let held = vec![
            ("a", 900 * MS),
            ("b", 1000 * MS),
            ("c", 1100 * MS),
            ("d", 1650 * MS),
        ];
        let got: Vec<&str> = w.to_report(held, |i| i.1).iter().map(|i| i.0).collect();
        assert_eq!(got, vec!["c", "d"]);
    }

    #[test]
    fn only_the_active_hub_reports() {
        let at = |i: &(u32, u64)| i.1;
        let mut o = Outbox::new(3);
        // Role not known yet: held.
        assert!(o.pass(Gate::NoHub, vec![(1, 10)], at).is_empty());
        // Primary: what was held and the new ones.
        assert_eq!(
            o.pass(Gate::Primary, vec![(2, 20)], at),
            vec![(1, 10), (2, 20)]
        );
        assert_eq!(o.pass(Gate::Primary, vec![], at), vec![]);
        // Standby, waiting: nothing, bounded.
        let wait = Gate::Standby {
            active: false,
            last_ok_ns: 0,
        };
        for k in 3..8 {
            assert!(o.pass(wait, vec![(k, k as u64 * 10)], at).is_empty());
        }
        // Took over; primary last answered at 55: incidents 5 (held 5, 6, 7 = bounded)
        // and before were reported by it.
        let active = Gate::Standby {
            active: true,
            last_ok_ns: 55,
        };
        assert_eq!(
            o.pass(active, vec![(8, 80)], at),
            vec![(6, 60), (7, 70), (8, 80)]
        );
        assert_eq!(
            o.pass(active, vec![(9, 1)], at),
            vec![(9, 1)],
            "new ones always"
        );
    }

    #[test]
    fn the_standby_lives_in_another_process() {
        // Ranks 0 and 1 share a process; rank 2 does not want a hub; rank 3 does.
        let procs = [(1, 10), (1, 10), (1, 11), (2, 10)];
        assert_eq!(standby_rank(&[true, true, false, true], &procs, 0), Some(3));
        assert_eq!(standby_rank(&[true, true, true, true], &procs, 0), Some(2));
        // Same pid on another host is another process.
        assert_eq!(standby_rank(&[true, true, false, true], &procs, 1), Some(3));
        // The starter need not be rank 0.
        assert_eq!(
            standby_rank(&[false, false, true, true], &procs, 2),
            Some(3)
        );
        assert_eq!(standby_rank(&[true, true, false, false], &procs, 0), None);
        assert_eq!(standby_rank(&[true], &[(1, 1)], 0), None);
        assert_eq!(standby_rank(&[], &[], 0), None);
    }

    #[test]
    fn hub_lists_round_trip_and_junk_is_refused() {
        let p: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let s: SocketAddr = "[::1]:6000".parse().unwrap();
        for h in [
            Hubs {
                primary: p,
                standby: None,
            },
            Hubs {
                primary: p,
                standby: Some(s),
            },
        ] {
            assert_eq!(Hubs::decode(&h.encode()), Ok(h));
        }
        assert_eq!(
            Hubs {
                primary: p,
                standby: Some(s)
            }
            .query_list(),
            "10.0.0.1:5000,[::1]:6000"
        );
        assert!(Hubs::decode("").is_err());
        assert!(Hubs::decode("h:1").unwrap_err().contains("ip:port"));
        assert!(Hubs::decode("10.0.0.1:5000,x").is_err());
        assert!(Hubs::decode("10.0.0.1:5000,10.0.0.1:5000")
            .unwrap_err()
            .contains("twice"));
    }
}
