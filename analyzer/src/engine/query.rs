//! What the service asks the engine about its communicators (`ListComms`, `GetComm`, the
//! memory gauge): read-only views of the per-communicator state.

use super::*;

impl Engine {
    /// Per-rank state of one communicator.
    pub fn comm_state(&self, comm_id: u64, now_ns: u64) -> Option<wire::CommState> {
        let comm = self.comms.get(&comm_id)?;
        let silent_after = dur_ns(self.cfg.silent_after);
        let ranks = comm
            .ranks
            .iter()
            .enumerate()
            .map(|(r, i)| wire::RankState {
                rank: r as u32,
                host: i.host.clone(),
                pid: i.pid,
                last_op_counter: i.newest_op.unwrap_or(0),
                state: state_wire(i.last_state) as i32,
                in_flight_ns: if i.last_state == ST_INFLIGHT
                    && i.last_in_flight_start_est != u64::MAX
                {
                    now_ns.saturating_sub(i.last_in_flight_start_est)
                } else {
                    0
                },
                last_seen_ns: i.last_seen_ns,
                last_duration_ns: i.last_duration_ns,
                send_count: i.last_send,
                recv_count: i.last_recv,
                send_rate: f64::from(i.last_send_rate),
                recv_rate: f64::from(i.last_recv_rate),
                silent: i.silent(now_ns, silent_after),
                reported: i.reported,
                records: i.records,
                records_dropped: i.records_dropped,
            })
            .collect();
        let mut procs = std::collections::HashMap::new();
        for i in &comm.ranks {
            let d = procs.entry((i.host.as_str(), i.pid)).or_insert(0u64);
            *d = (*d).max(i.records_dropped);
        }
        let records_dropped = procs.values().sum();
        let (t_base_ns, baseline) = comm
            .kinds
            .first()
            .map(|k| {
                let (t, b, _) = k.baseline.current();
                (t, b)
            })
            .unwrap_or((0, BaselineKind::None));
        Some(wire::CommState {
            comm_id,
            nranks: comm.nranks,
            ranks,
            tracked_rounds: comm.rounds.len() as u32,
            rounds_completed: comm.rounds_completed,
            t_base_ns,
            baseline: baseline as i32,
            first_seen_ns: comm.created_ns,
            last_seen_ns: comm.last_seen_ns,
            anomaly_ids: comm.anomaly_ids.clone(),
            shard: String::new(),
            records_dropped,
        })
    }

    /// Communicators tracked, ascending.
    pub fn comm_ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.comms.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// One summary line per communicator, ascending by id.
    pub fn comm_summaries(&self) -> Vec<wire::CommSummary> {
        self.comm_ids()
            .into_iter()
            .filter_map(|id| self.comms.get(&id))
            .map(|c| wire::CommSummary {
                comm_id: c.id,
                nranks: c.nranks,
                tracked_rounds: c.rounds.len() as u32,
                rounds_completed: c.rounds_completed,
                last_seen_ns: c.last_seen_ns,
                shard: String::new(),
                anomalies: c.anomaly_ids.len() as u32,
            })
            .collect()
    }

    /// Estimated heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.comms
            .values()
            .map(|c| c.heap_bytes() + 32)
            .sum::<usize>()
            + self.window_log.capacity() * std::mem::size_of::<WindowEval>()
            + std::mem::size_of::<Engine>()
    }
}
