//! The sampler: reads every registered frame each period, turns completed operations,
//! in-flight snapshots and heartbeats into records.

use super::*;

/// Where batches go.
pub trait Sink: Send {
    /// Delivers one batch (may block; runs on the reporter thread).
    fn deliver(&mut self, batch: wire::Batch);
    /// Called every reporter loop (about every 20 ms) even without batches.
    fn idle(&mut self) {}
    /// Waits, at most `timeout`, until every batch delivered so far has left the process
    /// (sent, or spooled). A sink whose `deliver` returns only then needs nothing here.
    fn settle(&mut self, _timeout: Duration) {}
}

/// Per-channel tick state of the operation in flight.
#[derive(Clone, Debug, Default)]
pub(super) struct ChanTicks {
    pub(super) last_send: u64,
    pub(super) last_recv: u64,
    pub(super) send_ticks: u32,
    pub(super) recv_ticks: u32,
}

#[derive(Debug, Default)]
pub(super) struct Track {
    pub(super) counter: Option<u64>,
    pub(super) chans: Vec<ChanTicks>,
    pub(super) last_snapshot_ns: u64,
    pub(super) seq_done: Option<u64>,
    /// Operations before this counter were looked at for a backfill already.
    pub(super) backfilled_to: u64,
}

/// The sampler: pure bookkeeping over frames, op logs and completions.
pub struct Sampler {
    pub(super) cfg: DiagConfig,
    pub(super) host: String,
    pub(super) pid: u32,
    pub(super) tracks: HashMap<u64, Track>,
    /// Ticks of operations that finished before their completion message was processed.
    pub(super) finished_ticks: HashMap<(u64, u64), Vec<ChanTicks>>,
    pub(super) seq: u64,
    /// Each host-backend rank's accumulated CPU wait (run-queue delay).
    pub(super) cpu_wait: CpuWaitTracker,
    /// The process's accumulated frozen time (measured by the diagnostic thread's parks).
    pub(super) frozen_ns: Option<u64>,
    /// See [`Sampler::busy`].
    pub(super) busy: bool,
    /// See [`Sampler::base_period`].
    pub(super) base: Duration,
}

pub(super) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub(super) fn rate(ticks: u32) -> f64 {
    if ticks == 0 {
        0.0
    } else {
        1.0 / f64::from(ticks)
    }
}

impl Sampler {
    /// A sampler for this process.
    pub fn new(cfg: DiagConfig) -> Sampler {
        Sampler {
            cfg,
            host: hostname(),
            pid: std::process::id(),
            tracks: HashMap::new(),
            finished_ticks: HashMap::new(),
            seq: 0,
            cpu_wait: CpuWaitTracker::default(),
            frozen_ns: None,
            busy: false,
            base: DEVICE_SAMPLE,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn record(
        &self,
        seq: u64,
        s: &Source,
        snap: &OpSnapshot,
        chans: &[ChanDone],
        ticks: Option<&[ChanTicks]>,
        thinning: Thinning,
        now: u64,
    ) -> wire::OpRecord {
        let counter = snap.op_counter;
        let end = if snap.state == OpState::InFlight {
            now
        } else {
            snap.end_ns
        };
        let dur = end.saturating_sub(snap.start_ns);
        let secs = (dur as f64 / 1e9).max(1e-9);
        let channels = chans
            .iter()
            .enumerate()
            .map(|(c, k)| {
                let t = ticks.and_then(|t| t.get(c)).cloned().unwrap_or_default();
                // An operation shorter than one tick may change its counts between two
                // samples without the sampler seeing it: count at least one tick then.
                let st = if k.send > 0 { t.send_ticks.max(1) } else { 0 };
                let rt = if k.recv > 0 { t.recv_ticks.max(1) } else { 0 };
                wire::ChannelStat {
                    send_count: k.send,
                    recv_count: k.recv,
                    expected_send: k.exp_send,
                    expected_recv: k.exp_recv,
                    send_rate: rate(st),
                    recv_rate: rate(rt),
                    send_per_sec: k.send as f64 / secs,
                    recv_per_sec: k.recv as f64 / secs,
                    wait_upstream_ns: Some(k.up),
                    wait_downstream_ns: Some(k.down),
                    ring_prev: Some(s.ident.ring_prev),
                    ring_next: Some(s.ident.ring_next),
                    ext: if k.wire > 0 {
                        HashMap::from([(ccld_wire::EXT_WIRE_NS.to_string(), k.wire as f64)])
                    } else {
                        HashMap::new()
                    },
                }
            })
            .collect();
        let mut rec = wire::OpRecord {
            trace: Some(wire::TraceId {
                comm_id: s.ident.comm_id,
                op_counter: counter,
                extension: 0,
            }),
            rank: s.ident.rank,
            nranks: s.ident.nranks,
            host: self.host.clone(),
            pid: self.pid,
            op: Some(crate::wire::type_set(&snap.info, &[])),
            start_ns: snap.start_ns,
            duration_ns: dur,
            channels,
            state: crate::wire::op_state(snap.state) as i32,
            seq,
            device: s.ident.device,
            cpu_wait_ns: self.cpu_wait.total(s.id),
            frozen_ns: self.frozen_ns,
            gap_ns: thinning.gap.gap_ns,
            elsewhere_ns: thinning.gap.elsewhere_ns,
            peer_wire: Vec::new(),
            stride: thinning.stride,
            failure: 0,
            peer_lost: None,
            mismatch: None,
            seq_space: wire::SeqSpace::Collective as i32,
            p2p: Vec::new(),
            duration_estimated: snap.state != OpState::InFlight && !snap.timed,
        };
        // Numbered in its sequence space when the runtime registered it (not when a test
        // drives the op log directly).
        if let Some(id) = s.seqs.get(counter) {
            set_identity(&mut rec, &id);
        }
        rec
    }

    pub(super) fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    pub(super) fn live_chans(s: &Source, counter: u64) -> Vec<ChanDone> {
        let block = (counter % crate::FRAME_BLOCKS as u64) as usize;
        Self::block_chans(s, block, s.frame.header().n_channels as usize)
    }

    /// The first `n` channels' counters in `block` of `s`'s frame.
    pub(super) fn block_chans(s: &Source, block: usize, n: usize) -> Vec<ChanDone> {
        (0..n).map(|c| chan_done(&s.frame, block, c)).collect()
    }

    /// One sampling tick over `sources` at `now` (process clock): updates the change
    /// counts and returns in-flight snapshots that are due. Afterwards [`Sampler::busy`]
    /// says whether an operation in flight had run for a sampling period or longer.
    pub fn sample(&mut self, sources: &[Arc<Source>], now: u64) -> Vec<wire::OpRecord> {
        let mut out = Vec::new();
        let inflight_ns = u64::try_from(self.cfg.inflight.as_nanos()).unwrap_or(u64::MAX);
        self.base = self.cfg.sample_period(sources);
        let period_ns = u64::try_from(self.base.as_nanos()).unwrap_or(u64::MAX);
        self.busy = false;
        for s in sources {
            let h = s.frame.header();
            if !h.mode {
                continue;
            }
            let Some(snap) = s.op_log.get(h.op_counter) else {
                continue;
            };
            if snap.state == OpState::InFlight && now.saturating_sub(snap.start_ns) >= period_ns {
                self.busy = true;
            }
            let tr = self.tracks.entry(s.id).or_default();
            if tr.counter != Some(h.op_counter) {
                if let Some(old) = tr.counter.take() {
                    // Kept for the completion message, if thinning lets one come.
                    let stride = s.thin.stride.load(Ordering::Relaxed);
                    if thin::selected(s.ident.comm_id, s.seqs.thin_key(old), stride)
                        || s.thin.snapshotted.load(Ordering::Relaxed) == old + 1
                    {
                        self.finished_ticks
                            .insert((s.id, old), std::mem::take(&mut tr.chans));
                    }
                }
                tr.counter = Some(h.op_counter);
                tr.chans = vec![ChanTicks::default(); h.n_channels as usize];
                tr.last_snapshot_ns = 0;
            }
            let live = Self::live_chans(s, h.op_counter);
            for (t, k) in tr.chans.iter_mut().zip(&live) {
                if k.send != t.last_send {
                    t.send_ticks += 1;
                    t.last_send = k.send;
                }
                if k.recv != t.last_recv {
                    t.recv_ticks += 1;
                    t.last_recv = k.recv;
                }
            }
            if snap.state == OpState::InFlight
                && now.saturating_sub(snap.start_ns) >= inflight_ns
                && now.saturating_sub(tr.last_snapshot_ns) >= inflight_ns
            {
                // Mark first, then look again (pairs with the light barrier in
                // `Source::op_done`): an operation that finished meanwhile gets no
                // snapshot, one still running is sure to report its completion.
                s.thin
                    .snapshotted
                    .store(h.op_counter + 1, Ordering::Relaxed);
                crate::asym::heavy();
                let running = s
                    .op_log
                    .get(h.op_counter)
                    .is_some_and(|x| x.state == OpState::InFlight);
                if running {
                    tr.last_snapshot_ns = now;
                    let ticks = tr.chans.clone();
                    // A suspected hang: the thinned completions before it.
                    let from = std::mem::replace(&mut tr.backfilled_to, h.op_counter);
                    let from = from.max(h.op_counter.saturating_sub(BACKFILL_OPS));
                    self.backfill(s, from, h.op_counter, now, &mut out);
                    let seq = self.next_seq();
                    let thinning = Thinning {
                        gap: s.gap_before(h.op_counter, snap.start_ns),
                        stride: s.thin.stride.load(Ordering::Relaxed).max(1),
                    };
                    out.push(self.record(seq, s, &snap, &live, Some(&ticks), thinning, now));
                }
            } else if snap.state != OpState::InFlight
                && now.saturating_sub(snap.end_ns) >= inflight_ns
                && tr.backfilled_to <= h.op_counter
            {
                // Idle for an in-flight period after its last operation: a rank that does
                // not enter the next one (H1) or whose peers hang in it (an inconsistent
                // call that completed here, H2) is the analyzer's next question; the
                // thinned completions up to that last operation go out.
                let end = h.op_counter + 1;
                let from = std::mem::replace(&mut tr.backfilled_to, end);
                let from = from.max(end.saturating_sub(BACKFILL_OPS + 1));
                self.backfill(s, from, end, now, &mut out);
            }
        }
        // Keep the finished-ticks map small (completions normally arrive within a tick).
        if self.finished_ticks.len() > 4096 {
            self.finished_ticks.clear();
        }
        out
    }

    /// Reports the completions of operations `from..to` of `s` that thinning left out, from
    /// the op log and the frame (both keep the last [`crate::FRAME_BLOCKS`] operations; an
    /// operation whose frame block was reused meanwhile is skipped). Called when operation
    /// `to` gets its first in-flight snapshot, or when the rank has been idle for an
    /// in-flight period after operation `to - 1`: the analyzer of a hang needs every rank's
    /// last rounds before it (an inconsistent call, H2, often completes on the rank that
    /// made it, which then waits in the next call or before it).
    pub(super) fn backfill(
        &mut self,
        s: &Source,
        from: u64,
        to: u64,
        now: u64,
        out: &mut Vec<wire::OpRecord>,
    ) {
        let recent = s.thin.recent.load(Ordering::Relaxed);
        for k in from..to {
            if recent & (1u64 << (k % 64)) != 0 {
                continue;
            }
            let Some(snap) = s.op_log.get(k).filter(|x| x.state != OpState::InFlight) else {
                continue;
            };
            let gap_ns = k
                .checked_sub(1)
                .and_then(|p| s.op_log.get(p))
                .filter(|p| p.state != OpState::InFlight && p.timed)
                .map(|p| snap.start_ns.saturating_sub(p.end_ns));
            // From the op log: the time elsewhere is not known (such a record times
            // nothing, `duration_estimated`).
            let thinning = Thinning {
                gap: Gap {
                    gap_ns,
                    elsewhere_ns: None,
                },
                stride: s.thin.stride.load(Ordering::Relaxed).max(1),
            };
            let block = (k % crate::FRAME_BLOCKS as u64) as usize;
            if u64::from(s.frame.trace(block).op_counter) != k & 0xffff_ffff {
                continue; // the frame block was reused meanwhile
            }
            let n = (snap.info.n_channels as usize).min(s.frame.channel_capacity());
            let chans = Self::block_chans(s, block, n);
            let seq = self.next_seq();
            out.push(self.record(seq, s, &snap, &chans, None, thinning, now));
        }
    }

    /// Whether the last [`Sampler::sample`] saw an operation in flight for a sampling
    /// period or longer: one whose SendRate/RecvRate the ticks are measuring.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// The sampling period in force at the last [`Sampler::sample`]
    /// ([`DiagConfig::sample_period`]).
    pub fn base_period(&self) -> Duration {
        self.base
    }

    pub(super) fn complete(&mut self, s: &Source, d: &Done, now: u64) -> wire::OpRecord {
        let mut rec = self.complete_plain(s, d, now);
        if let Some(f) = &d.failure {
            crate::failure::fill(&mut rec, f);
        }
        rec
    }

    pub(super) fn complete_plain(&mut self, s: &Source, d: &Done, now: u64) -> wire::OpRecord {
        let seq = self.next_seq();
        let chans = d.chans.as_slice();
        let mut rec = match self.tracks.get_mut(&s.id) {
            Some(tr) if tr.counter == Some(d.counter) => {
                tr.seq_done = Some(d.counter);
                let tr = &self.tracks[&s.id];
                self.record(seq, s, &d.snap, chans, Some(&tr.chans), d.thinning, now)
            }
            _ => {
                let ticks = self.finished_ticks.remove(&(s.id, d.counter));
                self.record(seq, s, &d.snap, chans, ticks.as_deref(), d.thinning, now)
            }
        };
        if let Some(id) = &d.id {
            set_identity(&mut rec, id);
        }
        rec.peer_wire = d
            .peer_wire
            .iter()
            .map(|w| wire::PeerWire {
                from: w.from,
                wire_ns: w.wire_ns,
            })
            .collect();
        rec
    }

    /// Reads the run-queue delay of the threads running the host-backend ranks' operations
    /// (every [`crate::sched::SCHED_SAMPLE`]).
    pub fn sample_cpu_wait(&mut self, sources: &[Arc<Source>]) {
        let threads: Vec<(u64, i32)> = sources
            .iter()
            .filter(|s| s.ident.device < 0)
            .map(|s| (s.id, s.exec_tid.load(Ordering::Relaxed)))
            .collect();
        self.cpu_wait.sample(&threads);
    }

    /// Sets the process's accumulated frozen time that the next records carry.
    pub fn set_frozen_ns(&mut self, total: Option<u64>) {
        self.frozen_ns = total;
    }

    /// The process heartbeat.
    pub fn heartbeat(&self, sources: &[Arc<Source>], now: u64) -> wire::Heartbeat {
        wire::Heartbeat {
            host: self.host.clone(),
            pid: self.pid,
            ranks: sources
                .iter()
                .map(|s| {
                    let h = s.frame.header();
                    let runtime =
                        s.seqs.last_collective().is_some() || s.seqs.p2p_groups().is_some();
                    wire::RankMembership {
                        comm_id: s.ident.comm_id,
                        rank: s.ident.rank,
                        nranks: s.ident.nranks,
                        last_op_counter: if runtime {
                            s.seqs.last_collective()
                        } else {
                            // Op log driven without sequence identities (tests).
                            s.op_log.get(h.op_counter).map(|_| h.op_counter)
                        },
                        last_p2p_counter: s.seqs.p2p_groups(),
                        last_call_error: s.pending_call_error(),
                    }
                })
                .collect(),
            records_dropped: dropped(),
            time_ns: now,
        }
    }
}

/// Numbers `rec` in the sequence space of `id` ([`crate::seqspace`]).
pub(super) fn set_identity(rec: &mut wire::OpRecord, id: &OpSeq) {
    if let Some(t) = rec.trace.as_mut() {
        t.op_counter = id.number;
    }
    rec.seq_space = match id.space {
        SeqSpace::Collective => wire::SeqSpace::Collective,
        SeqSpace::P2p => wire::SeqSpace::P2p,
    } as i32;
    rec.p2p = id
        .p2p
        .iter()
        .map(|p| wire::P2pPeerSeq {
            peer: p.peer,
            send: p.send,
            seq: p.seq,
            count: p.count,
            dtype: u32::from(p.dtype),
        })
        .collect();
}
