//! Fault injection (`CCLD_INJECT`, docs/diagnosis.md): lets tests, the demo and users
//! validating a deployment provoke each anomaly class of CCL-D on purpose.
//!
//! # Grammar
//! ```text
//! CCLD_INJECT = fault { ";" fault }
//! fault       = kind ":" key "=" value { "," key "=" value }
//! kind        = "s1" | "s2" | "s3" | "h1" | "h2" | "h3"
//! keys        = rank=R[+R...]      ranks (in the communicator) that misbehave (required)
//!               ops=A..B | A.. | A operation counters (B exclusive; default: every op)
//!               nranks=N           only communicators of N ranks (default: any)
//!               delay=D            s1, s3: entry delay per operation (e.g. 20ms, 1s, 500us)
//!               gap=D              s2, s3: minimum gap between two sends of one channel
//!               link=P             s2, s3: throttle only sends to rank P (default: all)
//!               channel=C          h3: only this channel stalls (default: every channel)
//! ```
//! Durations take `us`, `ms` or `s`. Unknown kinds or keys, a missing `rank`, an empty
//! range or a duration of zero are errors naming `CCLD_INJECT` (init fails).
//!
//! # Effects (host executor)
//! - **s1** (computation-slow): the rank sleeps `delay` before entering the operation.
//! - **s2** (communication-slow): a send on a throttled channel waits until `gap` after the
//!   previous send of that channel; the executor counts that time as waiting downstream,
//!   exactly as if the link were slow.
//! - **s3**: both.
//! - **h1** (not entered): the rank does not enter the first selected operation; its call
//!   blocks before the operation counter advances until the communicator is aborted.
//! - **h2** (inconsistent): the rank issues the first selected operation with half the
//!   element count (same chunk size, half the steps): its op type set differs and it
//!   completes early; afterwards it issues no further operation on that communicator (its
//!   calls block until abort, like an application whose control flow diverged), so its peers
//!   wait forever for the rest. (Without that, identical later operations would silently
//!   re-align the streams, as they would with NCCL.)
//! - **h3** (hardware fault): the rank enters the operation, then its channels (or only
//!   channel `channel`) never progress (abortable): every rank ends up hung and the rank
//!   with the fewest SendCount/RecvCount is the root.

use std::time::Duration;

use crate::error::{CclError, Result};

/// Anomaly class to provoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultKind {
    /// Entry delay.
    S1,
    /// Throttled sends.
    S2,
    /// Both.
    S3,
    /// Never enters.
    H1,
    /// Different operation (half the count).
    H2,
    /// Channel stall.
    H3,
}

/// One parsed fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    /// Kind.
    pub kind: FaultKind,
    /// Ranks (in the communicator).
    pub ranks: Vec<usize>,
    /// First operation counter selected.
    pub op_start: u64,
    /// End of the range (exclusive); `None` = open.
    pub op_end: Option<u64>,
    /// Only communicators of this size.
    pub nranks: Option<usize>,
    /// Entry delay (s1, s3).
    pub delay: Duration,
    /// Minimum gap between sends of one channel (s2, s3).
    pub gap: Duration,
    /// Throttled peer (None = every peer).
    pub link: Option<usize>,
    /// Stalled channel (h3), `None` = every channel.
    pub channel: Option<usize>,
}

impl Fault {
    /// Whether this fault applies to `rank` of a communicator of `nranks` at op `counter`.
    pub(crate) fn applies(&self, rank: usize, nranks: usize, counter: u64) -> bool {
        self.ranks.contains(&rank)
            && self.nranks.is_none_or(|n| n == nranks)
            && counter >= self.op_start
            && self.op_end.is_none_or(|e| counter < e)
    }
}

/// All faults of `CCLD_INJECT`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Injection {
    /// Faults, in spec order.
    pub faults: Vec<Fault>,
}

/// What one operation of one rank must do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpFault {
    /// Sleep before entering.
    pub delay: Option<Duration>,
    /// Send gap and throttled peer.
    pub throttle: Option<(Duration, Option<usize>)>,
    /// Never enter.
    pub not_enter: bool,
    /// Half the count.
    pub halve: bool,
    /// Stall (h3): `Some(None)` every channel, `Some(Some(c))` channel `c`.
    pub stall: Option<Option<usize>>,
}

impl OpFault {
    /// True when nothing is injected.
    pub fn is_none(&self) -> bool {
        *self == OpFault::default()
    }
}

impl Injection {
    /// Reads and parses `CCLD_INJECT` (`None` when unset).
    pub(crate) fn from_env() -> Result<Option<Injection>> {
        match crate::env::var(&ccl_params::CCLD_INJECT)? {
            None => Ok(None),
            Some(v) => parse(&v).map(Some),
        }
    }

    /// The combined effect on `rank` of an `nranks` communicator at op `counter`.
    pub(crate) fn for_op(&self, rank: usize, nranks: usize, counter: u64) -> OpFault {
        let mut o = OpFault::default();
        for f in self
            .faults
            .iter()
            .filter(|f| f.applies(rank, nranks, counter))
        {
            match f.kind {
                FaultKind::S1 => o.delay = Some(f.delay),
                FaultKind::S2 => o.throttle = Some((f.gap, f.link)),
                FaultKind::S3 => {
                    o.delay = Some(f.delay);
                    o.throttle = Some((f.gap, f.link));
                }
                FaultKind::H1 => o.not_enter = true,
                FaultKind::H2 => o.halve = true,
                FaultKind::H3 => o.stall = Some(f.channel),
            }
        }
        o
    }
}

fn bad(msg: impl std::fmt::Display) -> CclError {
    CclError::arg(format!("CCLD_INJECT: {msg}"))
}

fn parse_duration(key: &str, v: &str) -> Result<Duration> {
    let (num, unit) = if let Some(n) = v.strip_suffix("us") {
        (n, 1_000u64)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1_000_000)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1_000_000_000)
    } else {
        return Err(bad(format!(
            "{key}={v:?} needs a unit (us, ms or s), e.g. {key}=20ms"
        )));
    };
    let n: u64 = num.parse().map_err(|_| {
        bad(format!(
            "{key}={v:?} is not a whole number of {}",
            &v[num.len()..]
        ))
    })?;
    let ns = n
        .checked_mul(unit)
        .filter(|&ns| ns > 0 && ns <= 3_600_000_000_000)
        .ok_or_else(|| bad(format!("{key}={v:?} must be between 1us and 1 hour")))?;
    Ok(Duration::from_nanos(ns))
}

fn parse_usize(key: &str, v: &str) -> Result<usize> {
    v.parse::<usize>()
        .ok()
        .filter(|&n| n < 1 << 20)
        .ok_or_else(|| bad(format!("{key}={v:?} is not a rank/channel number")))
}

fn parse_u64(key: &str, v: &str) -> Result<u64> {
    v.parse::<u64>()
        .map_err(|_| bad(format!("{key}: {v:?} is not an operation counter")))
}

/// Parses a `CCLD_INJECT` value (pure).
pub(crate) fn parse(spec: &str) -> Result<Injection> {
    let mut faults = Vec::new();
    for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (kind, rest) = part
            .split_once(':')
            .ok_or_else(|| bad(format!("{part:?}: expected KIND:key=value,...")))?;
        let kind = match kind.trim().to_ascii_lowercase().as_str() {
            "s1" => FaultKind::S1,
            "s2" => FaultKind::S2,
            "s3" => FaultKind::S3,
            "h1" => FaultKind::H1,
            "h2" => FaultKind::H2,
            "h3" => FaultKind::H3,
            k => {
                return Err(bad(format!(
                    "unknown kind {k:?} (expected s1, s2, s3, h1, h2 or h3)"
                )))
            }
        };
        let mut f = Fault {
            kind,
            ranks: Vec::new(),
            op_start: 0,
            op_end: None,
            nranks: None,
            delay: Duration::ZERO,
            gap: Duration::ZERO,
            link: None,
            channel: None,
        };
        let mut seen: Vec<&str> = Vec::new();
        for kv in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad(format!("{kv:?}: expected key=value")))?;
            let (k, v) = (k.trim(), v.trim());
            if seen.contains(&k) {
                return Err(bad(format!("key {k:?} given twice in {part:?}")));
            }
            seen.push(k);
            let only = |kinds: &[FaultKind]| -> Result<()> {
                if kinds.contains(&kind) {
                    Ok(())
                } else {
                    Err(bad(format!("key {k:?} does not apply to {kind:?}")))
                }
            };
            match k {
                "rank" => {
                    for r in v.split('+') {
                        let r = parse_usize("rank", r.trim())?;
                        if !f.ranks.contains(&r) {
                            f.ranks.push(r);
                        }
                    }
                }
                "ops" => {
                    if let Some((a, b)) = v.split_once("..") {
                        f.op_start = parse_u64("ops", a.trim())?;
                        if !b.trim().is_empty() {
                            let e = parse_u64("ops", b.trim())?;
                            if e <= f.op_start {
                                return Err(bad(format!("ops={v:?} is an empty range")));
                            }
                            f.op_end = Some(e);
                        }
                    } else {
                        f.op_start = parse_u64("ops", v)?;
                        f.op_end = Some(f.op_start + 1);
                    }
                }
                "nranks" => {
                    let n = parse_usize("nranks", v)?;
                    if n == 0 {
                        return Err(bad("nranks=0"));
                    }
                    f.nranks = Some(n);
                }
                "delay" => {
                    only(&[FaultKind::S1, FaultKind::S3])?;
                    f.delay = parse_duration(k, v)?;
                }
                "gap" => {
                    only(&[FaultKind::S2, FaultKind::S3])?;
                    f.gap = parse_duration(k, v)?;
                }
                "link" => {
                    only(&[FaultKind::S2, FaultKind::S3])?;
                    f.link = Some(parse_usize("link", v)?);
                }
                "channel" => {
                    only(&[FaultKind::H3])?;
                    f.channel = Some(parse_usize("channel", v)?);
                }
                other => return Err(bad(format!("unknown key {other:?} in {part:?}"))),
            }
        }
        if f.ranks.is_empty() {
            return Err(bad(format!("{part:?} selects no rank (add rank=N)")));
        }
        let need = |key: &str, set: bool| -> Result<()> {
            if set {
                Ok(())
            } else {
                Err(bad(format!("{part:?} needs {key}=DURATION")))
            }
        };
        match kind {
            FaultKind::S1 => need("delay", !f.delay.is_zero())?,
            FaultKind::S2 => need("gap", !f.gap.is_zero())?,
            FaultKind::S3 => {
                need("delay", !f.delay.is_zero())?;
                need("gap", !f.gap.is_zero())?;
            }
            _ => {}
        }
        faults.push(f);
    }
    if faults.is_empty() {
        return Err(bad("no fault given"));
    }
    Ok(Injection { faults })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        match parse(s) {
            Err(CclError::InvalidArgument(m)) => m,
            other => panic!("{s:?} parsed: {other:?}"),
        }
    }

    #[test]
    fn parses_every_kind_and_key() {
        let i = parse("s1:rank=2,ops=100..200,delay=20ms; s2:rank=1+3,gap=500us,link=2,nranks=4;s3:rank=0,delay=1s,gap=2ms;h1:rank=5,ops=7..;h2:rank=1,ops=9;H3:rank=0,channel=1").unwrap();
        assert_eq!(i.faults.len(), 6);
        let f = &i.faults[0];
        assert_eq!((f.kind, f.ranks.clone()), (FaultKind::S1, vec![2]));
        assert_eq!((f.op_start, f.op_end), (100, Some(200)));
        assert_eq!(f.delay, Duration::from_millis(20));
        let f = &i.faults[1];
        assert_eq!(f.ranks, vec![1, 3]);
        assert_eq!(
            (f.gap, f.link, f.nranks),
            (Duration::from_micros(500), Some(2), Some(4))
        );
        assert_eq!((f.op_start, f.op_end), (0, None));
        assert_eq!(i.faults[2].delay, Duration::from_secs(1));
        assert_eq!((i.faults[3].op_start, i.faults[3].op_end), (7, None));
        assert_eq!((i.faults[4].op_start, i.faults[4].op_end), (9, Some(10)));
        assert_eq!(
            (i.faults[5].kind, i.faults[5].channel),
            (FaultKind::H3, Some(1))
        );
    }

    #[test]
    fn selection_by_rank_size_and_range() {
        let i = parse("s1:rank=2,ops=10..12,delay=1ms,nranks=4;h3:rank=2,ops=11").unwrap();
        assert!(i.for_op(2, 4, 9).is_none());
        assert_eq!(i.for_op(2, 4, 10).delay, Some(Duration::from_millis(1)));
        let o = i.for_op(2, 4, 11);
        assert_eq!((o.delay.is_some(), o.stall), (true, Some(None)));
        assert!(i.for_op(2, 4, 12).is_none());
        assert!(i.for_op(1, 4, 10).is_none());
        assert!(i.for_op(2, 8, 10).is_none(), "nranks filter");
        let o = parse("s3:rank=1,delay=2ms,gap=3ms,link=0")
            .unwrap()
            .for_op(1, 2, 0);
        assert_eq!(o.delay, Some(Duration::from_millis(2)));
        assert_eq!(o.throttle, Some((Duration::from_millis(3), Some(0))));
        let o = parse("h1:rank=0;h2:rank=0").unwrap().for_op(0, 2, 5);
        assert!(o.not_enter && o.halve);
    }

    #[test]
    fn bad_specs_are_errors_naming_the_variable() {
        for s in [
            "",
            ";",
            "s1",
            "x9:rank=1",
            "s1:rank=1",
            "s1:delay=2ms",
            "s1:rank=1,delay=2",
            "s1:rank=1,delay=0ms",
            "s1:rank=1,delay=-3ms",
            "s1:rank=1,delay=2h",
            "s1:rank=a,delay=2ms",
            "s1:rank=1,delay=2ms,delay=3ms",
            "s1:rank=1,delay=2ms,gap=1ms",
            "s2:rank=1",
            "s2:rank=1,gap=1ms,channel=0",
            "h3:rank=1,link=2",
            "h1:rank=1,ops=5..5",
            "h1:rank=1,ops=x..",
            "h1:rank=1,nranks=0",
            "h1:rank=1,color=3",
            "h1:rank=1,ops",
            "s3:rank=1,delay=1ms",
        ] {
            let m = err(s);
            assert!(m.starts_with("CCLD_INJECT"), "{s:?}: {m}");
        }
        assert!(err("s1:rank=1,delay=2").contains("unit"));
        assert!(err("zz:rank=1").contains("unknown kind"));
    }
}
