//! Delivery to the job's hubs: one forwarding thread per hub, so that a hub that hangs
//! (its process stopped: every call waits for its deadline) never delays the batches of
//! the other.
//!
//! Each [`HubLink`] owns a [`RemoteSink`] (spool and reconnect included; the standby's
//! spool lives in `CCLD_SPOOL_DIR/standby/`) fed through a bounded queue of
//! [`QUEUE_BATCHES`] batches. When a link's queue is full the batch is not queued for that
//! hub (counted in [`HubLink::dropped`]); the other hub still receives it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccld_wire as wire;

use crate::diag::Sink;
use crate::reporter::{RemoteSink, SpoolSettings};
use crate::standby::Hubs;

/// Batches queued per hub before new ones are dropped for it.
pub(crate) const QUEUE_BATCHES: usize = 256;

/// One hub's forwarding thread.
pub(crate) struct HubLink {
    tx: SyncSender<wire::Batch>,
    dropped: Arc<AtomicU64>,
    /// Batches queued for the thread, and those it has handled (sent, or spooled when the
    /// hub cannot be reached): see [`HubLink::settle`].
    queued: AtomicU64,
    handled: Arc<AtomicU64>,
    addr: String,
}

impl HubLink {
    /// Starts the thread for the hub at `addr`, spooling in `spool.dir`.
    pub(crate) fn start(addr: String, spool: &SpoolSettings) -> Result<HubLink, String> {
        let mut sink = RemoteSink::new(vec![addr.clone()], spool.open()?)?;
        let (tx, rx) = sync_channel::<wire::Batch>(QUEUE_BATCHES);
        let handled = Arc::new(AtomicU64::new(0));
        let done = Arc::clone(&handled);
        std::thread::Builder::new()
            .name("ccld-hublink".into())
            .spawn(move || loop {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(b) => {
                        sink.deliver(b);
                        done.fetch_add(1, Ordering::Release);
                    }
                    Err(RecvTimeoutError::Timeout) => sink.idle(),
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            })
            .map_err(|e| format!("starting the hub link thread: {e}"))?;
        Ok(HubLink {
            tx,
            dropped: Arc::new(AtomicU64::new(0)),
            queued: AtomicU64::new(0),
            handled,
            addr,
        })
    }

    /// Waits until the thread has handled every batch queued so far (sent, or spooled), or
    /// until `deadline`; true when it has. A flush must not count a batch as delivered
    /// while it still sits in this queue: a process that exits right after its flush (a
    /// survivor ending on its own error) would take its last records with it.
    pub(crate) fn settle(&self, deadline: Instant) -> bool {
        let want = self.queued.load(Ordering::Relaxed);
        loop {
            if self.handled.load(Ordering::Acquire) >= want {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Queues a batch for the hub (never blocks).
    pub(crate) fn send(&self, b: wire::Batch) {
        match self.tx.try_send(b) {
            Ok(()) => {
                self.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(b)) | Err(TrySendError::Disconnected(b)) => {
                let before = self.dropped.fetch_add(1, Ordering::Relaxed);
                if before == 0 {
                    tracing::debug!(target: "nccl::NET",
                        "CCL-D: the analyzer hub {} is not keeping up; dropping batches for it ({} records)",
                        self.addr, b.records.len());
                }
            }
        }
    }

    /// Batches not queued for this hub so far.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The links to all of the job's hubs.
pub(crate) struct HubLinks {
    links: Vec<HubLink>,
}

impl HubLinks {
    /// Links to the primary (spool in `spool.dir`) and the standby (`spool.dir/standby`).
    /// Fails only when no link at all could be made.
    pub(crate) fn start(hubs: Hubs, spool: &SpoolSettings) -> Result<HubLinks, String> {
        let mut links = vec![HubLink::start(hubs.primary.to_string(), spool)?];
        if let Some(s) = hubs.standby {
            let sp = SpoolSettings {
                dir: spool.dir.join("standby"),
                max_bytes: spool.max_bytes,
            };
            match HubLink::start(s.to_string(), &sp) {
                Ok(l) => links.push(l),
                Err(e) => tracing::warn!(target: "nccl::COLL",
                    "CCL-D: cannot report to the standby hub {s} ({e}); primary only"),
            }
        }
        Ok(HubLinks { links })
    }

    /// Sends `b` to every hub.
    pub(crate) fn send(&self, b: wire::Batch) {
        if let Some((last, rest)) = self.links.split_last() {
            for l in rest {
                l.send(b.clone());
            }
            last.send(b);
        }
    }

    /// [`HubLink::settle`] of every link, with one deadline; true when all settled.
    pub(crate) fn settle(&self, deadline: Instant) -> bool {
        self.links.iter().all(|l| l.settle(deadline))
    }

    /// The links (primary first).
    #[cfg(test)]
    pub(crate) fn links(&self) -> &[HubLink] {
        &self.links
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use analyzer::EngineConfig;
    use analyzer_net::client::{BlockingClient, ClientConfig};
    use analyzer_net::server::{ServerConfig, ShardProcess};

    fn batch(op: u64) -> wire::Batch {
        wire::Batch {
            records: vec![wire::OpRecord {
                trace: Some(wire::TraceId {
                    comm_id: 0x77,
                    op_counter: op,
                    extension: 0,
                }),
                rank: 0,
                nranks: 2,
                host: "h".into(),
                pid: 1,
                op: Some(wire::OpTypeSet {
                    bytes: 8,
                    count: 2,
                    dtype: 7,
                    root: -1,
                    peer: -1,
                    n_channels: 1,
                    ..Default::default()
                }),
                start_ns: op * 1_000_000,
                duration_ns: 1000,
                channels: vec![wire::ChannelStat::default()],
                state: wire::OpState::Completed as i32,
                seq: op,
                device: -1,
                ..Default::default()
            }],
            heartbeats: vec![],
        }
    }

    /// A hub shard on 127.0.0.1 and spool settings in a fresh directory named by `tag`.
    fn hub_and_spool(tag: &str) -> (ShardProcess, SpoolSettings) {
        let hub = ShardProcess::spawn(
            ServerConfig::single(EngineConfig::default()),
            "127.0.0.1:0".parse().unwrap(),
            None,
            1,
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("ccld-hublink-{tag}-{}", std::process::id()));
        let spool = SpoolSettings {
            dir,
            max_bytes: 1 << 20,
        };
        (hub, spool)
    }

    /// A flush counts a batch as delivered only once it left the process: after `settle`
    /// the hub has it (no polling), and a hub that never answers bounds the wait.
    #[test]
    fn settle_returns_once_the_hub_has_the_batches_and_is_bounded() {
        let (hub, spool) = hub_and_spool("settle");
        let link = HubLink::start(hub.addr.to_string(), &spool).unwrap();
        let mut c = BlockingClient::new(ClientConfig::new([hub.addr.to_string()])).unwrap();
        for op in 1..=30u64 {
            link.send(batch(op));
            assert!(link.settle(Instant::now() + Duration::from_secs(10)));
            let s = c
                .get_comm(wire::GetCommRequest {
                    comm_id: 0x77,
                    ..Default::default()
                })
                .unwrap();
            assert_eq!(s.ranks.first().map(|r| r.last_op_counter), Some(op));
        }
        drop(link);
        hub.kill();
        // A hub that accepts and never answers: settle gives up at its deadline.
        let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let link = HubLink::start(black_hole.local_addr().unwrap().to_string(), &spool).unwrap();
        link.send(batch(1));
        let t0 = Instant::now();
        assert!(!link.settle(t0 + Duration::from_millis(300)));
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );
        let _ = std::fs::remove_dir_all(&spool.dir);
    }

    /// A primary that hangs (a listener that accepts connections and never answers, as a
    /// SIGSTOPped hub process does) must not delay the standby: every batch reaches the
    /// standby within a second, while the primary's link waits out its deadlines.
    #[test]
    fn a_hanging_primary_does_not_delay_the_standby() {
        let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (standby, spool) = hub_and_spool("standby");
        let hubs = Hubs {
            primary: black_hole.local_addr().unwrap(),
            standby: Some(standby.addr),
        };
        let links = HubLinks::start(hubs, &spool).unwrap();
        assert_eq!(links.links().len(), 2);
        let t0 = Instant::now();
        for op in 0..20 {
            links.send(batch(op));
        }
        assert!(
            t0.elapsed() < Duration::from_millis(100),
            "send never blocks"
        );
        let mut c = BlockingClient::new(ClientConfig::new([standby.addr.to_string()])).unwrap();
        let mut last = 0;
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(s) = c.get_comm(wire::GetCommRequest {
                comm_id: 0x77,
                ..Default::default()
            }) {
                last = s.ranks.first().map_or(0, |r| r.last_op_counter);
                if last == 19 {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = t0.elapsed();
        assert_eq!(last, 19, "the standby got every batch");
        assert!(took < Duration::from_secs(1), "standby delayed: {took:?}");
        // The hanging primary's queue holds the batches (nothing lost for it yet); the
        // standby's queue drained.
        assert_eq!(links.links()[1].dropped(), 0);
        // Flooding past the queue drops for the stuck primary only, never blocking.
        let t1 = Instant::now();
        for op in 20..(20 + 2 * QUEUE_BATCHES as u64) {
            links.send(batch(op));
        }
        assert!(t1.elapsed() < Duration::from_millis(500));
        assert!(links.links()[0].dropped() > 0);
        drop(links);
        standby.kill();
        let _ = std::fs::remove_dir_all(&spool.dir);
    }
}
