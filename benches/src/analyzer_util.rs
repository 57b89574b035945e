//! Helpers shared by the analyzer benchmarks: synthetic valid record streams, statistics.

use ccld_wire::{self as wire, ChannelStat, OpRecord, OpState, OpTypeSet, TraceId};

/// SplitMix64 finaliser (distinct inputs give distinct ids).
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// CPU seconds (user + system) consumed so far by this process (`self`) or this thread
/// (`thread-self`), from `/proc/<who>/stat` (Linux, 100 clock ticks per second). `None`
/// where unavailable.
pub fn cpu_seconds(who: &str) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{who}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ut: f64 = f.get(11)?.parse().ok()?;
    let st: f64 = f.get(12)?.parse().ok()?;
    Some((ut + st) / 100.0)
}

/// CPU seconds consumed so far by this process's threads whose name starts with `prefix`
/// (e.g. `ccld-shard`, the analyzer shard runtimes' threads), from `/proc/self/task`.
pub fn cpu_seconds_of_threads(prefix: &str) -> Option<f64> {
    let mut total = 0.0;
    for e in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(e) = e else { continue };
        let Ok(s) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some((head, rest))) = (s.find('('), s.rsplit_once(')')) else {
            continue;
        };
        let name = &head[open + 1..];
        if !name.starts_with(prefix) {
            continue;
        }
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ut: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let st: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        total += (ut + st) / 100.0;
    }
    Some(total)
}

/// Least-squares fit y = a + b x; returns (a, b, r^2).
pub fn linear_fit(xs: &[f64], ys: &[f64]) -> (f64, f64, f64) {
    let n = xs.len() as f64;
    if xs.len() < 2 {
        return (ys.first().copied().unwrap_or(0.0), 0.0, 1.0);
    }
    let mx = xs.iter().sum::<f64>() / n;
    let my = ys.iter().sum::<f64>() / n;
    let sxy: f64 = xs.iter().zip(ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let b = if sxx == 0.0 { 0.0 } else { sxy / sxx };
    let a = my - b * mx;
    let ss_tot: f64 = ys.iter().map(|y| (y - my) * (y - my)).sum();
    let ss_res: f64 = xs
        .iter()
        .zip(ys)
        .map(|(x, y)| {
            let e = y - (a + b * x);
            e * e
        })
        .sum();
    let r2 = if ss_tot == 0.0 {
        1.0
    } else {
        1.0 - ss_res / ss_tot
    };
    (a, b, r2)
}

/// Median of a non-empty slice (sorted copy).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        0.0
    } else {
        s[s.len() / 2]
    }
}

/// Generates completed records of `comms` communicators x `nranks` ranks, round after
/// round, in an order the engine accepts (each rank's operations in sequence).
#[derive(Debug)]
pub struct RecordGen {
    comm_ids: Vec<u64>,
    nranks: u32,
    channels: u32,
    next_op: u64,
    hosts: Vec<String>,
}

impl RecordGen {
    /// A generator; `salt` makes the communicator ids distinct between generators.
    pub fn new(salt: u64, comms: usize, nranks: u32, channels: u32) -> Self {
        Self {
            comm_ids: (0..comms as u64)
                .map(|k| mix64((salt << 24) ^ k) | 1)
                .collect(),
            nranks,
            channels,
            next_op: 1,
            hosts: (0..nranks).map(|r| format!("node{:04}", r / 8)).collect(),
        }
    }

    /// Communicator ids.
    pub fn comm_ids(&self) -> &[u64] {
        &self.comm_ids
    }

    /// Records of one round of every communicator.
    pub fn round(&mut self) -> Vec<OpRecord> {
        let op = self.next_op;
        self.next_op += 1;
        let mut out = Vec::with_capacity(self.comm_ids.len() * self.nranks as usize);
        for &c in &self.comm_ids {
            for r in 0..self.nranks {
                out.push(self.record(c, op, r));
            }
        }
        out
    }

    fn record(&self, comm: u64, op: u64, rank: u32) -> OpRecord {
        let dur = 1_000_000 + u64::from(rank % 7) * 10_000;
        OpRecord {
            trace: Some(TraceId {
                comm_id: comm,
                op_counter: op,
                extension: 0,
            }),
            rank,
            nranks: self.nranks,
            host: self.hosts[rank as usize].clone(),
            pid: 10_000 + rank,
            op: Some(OpTypeSet {
                collective: wire::CollKind::AllReduce as i32,
                algorithm: wire::Algorithm::Ring as i32,
                protocol: wire::Protocol::Simple as i32,
                dtype: 7,
                count: 1 << 20,
                bytes: 4 << 20,
                redop: 0,
                root: -1,
                peer: -1,
                n_channels: self.channels,
                tree_layer: vec![],
            }),
            start_ns: op * 5_000_000,
            duration_ns: dur,
            channels: (0..self.channels)
                .map(|_| ChannelStat {
                    send_count: 2 * u64::from(self.nranks - 1),
                    recv_count: 2 * u64::from(self.nranks - 1),
                    expected_send: 2 * u64::from(self.nranks - 1),
                    expected_recv: 2 * u64::from(self.nranks - 1),
                    send_rate: 0.5,
                    recv_rate: 0.5,
                    send_per_sec: 1e4,
                    recv_per_sec: 1e4,
                    ..Default::default()
                })
                .collect(),
            state: OpState::Completed as i32,
            seq: op,
            device: -1,
            cpu_wait_ns: None,
            frozen_ns: None,
            duration_estimated: false,
            elsewhere_ns: None,
            peer_wire: Vec::new(),
            gap_ns: None,
            stride: 0,
            failure: 0,
            peer_lost: None,
            mismatch: None,
            seq_space: 0,
            p2p: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_readable_and_grows() {
        let a = cpu_seconds("self").unwrap();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert!(cpu_seconds("self").unwrap() >= a);
        assert!(cpu_seconds("thread-self").is_some());
    }

    #[test]
    fn fit_recovers_a_line() {
        let xs = [1.0, 2.0, 3.0, 4.0];
        let ys = [3.0, 5.0, 7.0, 9.0];
        let (a, b, r2) = linear_fit(&xs, &ys);
        assert!((a - 1.0).abs() < 1e-9 && (b - 2.0).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-12);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn generated_records_are_accepted() {
        let mut g = RecordGen::new(9, 3, 16, 2);
        let mut e = analyzer::Engine::new(analyzer::EngineConfig::default());
        for _ in 0..5 {
            for r in g.round() {
                e.ingest(&r, 1_700_000_000_000_000_000).unwrap();
            }
        }
        assert_eq!(e.comm_ids().len(), 3);
    }

    #[test]
    fn generators_do_not_share_communicators() {
        let mut all: Vec<u64> = (0..8)
            .flat_map(|salt| RecordGen::new(1000 + salt, 64, 2, 1).comm_ids().to_vec())
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}
