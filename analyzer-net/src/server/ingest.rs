//! The shard's ingest path: the `Ingest` / `IngestOne` handlers, both for the generated
//! prost server (a decoded `Batch`) and for the fast path ([`crate::codec::IngestFastPath`],
//! the message bytes decoded here into a per-thread [`BatchScratch`] that keeps its
//! records' allocations from one message to the next).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use tonic::{Request, Response, Status, Streaming};

use super::{Service, Shared, MAX_REPLY_REASONS};
use crate::codec::{BatchDecodeError, BatchScratch, RawIngest};
use ccld_wire::{Batch, Heartbeat, IngestReply, OpRecord};

#[derive(Default)]
pub(super) struct IngestAcc {
    accepted: u64,
    rejected: u64,
    reasons: Vec<String>,
}

impl IngestAcc {
    fn into_reply(self) -> IngestReply {
        IngestReply {
            accepted: self.accepted,
            rejected: self.rejected,
            reasons: self.reasons,
        }
    }
}

thread_local! {
    /// Decoded records reused by the fast path on this thread (decode and apply run
    /// without an await in between, so one per thread is enough).
    static SCRATCH: RefCell<BatchScratch> = RefCell::new(BatchScratch::new());
}

impl Shared {
    /// Feeds records and heartbeats to the engine and counts them.
    pub(super) fn apply(
        &self,
        records: &[OpRecord],
        heartbeats: &[Heartbeat],
        acc: &mut IngestAcc,
    ) {
        let now = self.now();
        let mut not_owned = 0u64;
        let mut rejects: HashMap<&'static str, u64> = HashMap::new();
        // Records of one communicator come in runs: hash its owner once per run.
        let mut owner_of: Option<(u64, bool)> = None;
        {
            let mut eng = self.engine();
            for r in records {
                match eng.ingest(r, now) {
                    Ok(()) => {
                        acc.accepted += 1;
                        if let (Some(m), Some(t)) = (&self.shards, &r.trace) {
                            let owned = match owner_of {
                                Some((c, o)) if c == t.comm_id => o,
                                _ => {
                                    let o = m.owner(t.comm_id) == self.shard_id;
                                    owner_of = Some((t.comm_id, o));
                                    o
                                }
                            };
                            if !owned {
                                not_owned += 1;
                            }
                        }
                    }
                    Err(e) => {
                        acc.rejected += 1;
                        *rejects.entry(e.code()).or_insert(0) += 1;
                        if acc.reasons.len() < MAX_REPLY_REASONS {
                            acc.reasons.push(e.to_string());
                        }
                    }
                }
            }
            for h in heartbeats {
                eng.heartbeat(h, now);
            }
        }
        let m = &self.metrics;
        m.batches.fetch_add(1, Ordering::Relaxed);
        m.records_ingested.fetch_add(
            records.len() as u64 - rejects.values().sum::<u64>(),
            Ordering::Relaxed,
        );
        m.heartbeats
            .fetch_add(heartbeats.len() as u64, Ordering::Relaxed);
        m.records_not_owned.fetch_add(not_owned, Ordering::Relaxed);
        for (k, v) in rejects {
            m.records_rejected.add(k, v);
        }
    }

    /// Decodes one `Batch` message and applies it; a malformed message is applied not at
    /// all and counted as a bad request of `method`.
    fn apply_encoded(
        &self,
        bytes: &[u8],
        acc: &mut IngestAcc,
        method: &str,
    ) -> Result<(), BatchDecodeError> {
        let run = |s: &mut BatchScratch, acc: &mut IngestAcc| {
            let r = s.decode(bytes);
            if r.is_ok() {
                self.apply(s.records(), s.heartbeats(), acc);
            }
            s.trim();
            r
        };
        let r = SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => run(&mut s, acc),
            // Not reentrant today; a fresh scratch keeps it correct should it become so.
            Err(_) => run(&mut BatchScratch::new(), acc),
        });
        if r.is_err() {
            self.metrics.bad_requests.add(method, 1);
        }
        r
    }
}

impl Service {
    /// `Ingest` through the generated prost server (decoded batches).
    pub(super) async fn ingest_decoded(
        &self,
        request: Request<Streaming<Batch>>,
    ) -> Result<Response<IngestReply>, Status> {
        self.ingest_stream(request, |sh, b: &Batch, acc| {
            sh.apply(&b.records, &b.heartbeats, acc);
            Ok(())
        })
        .await
    }

    /// `Ingest` of either server: authenticates, applies every message of the stream with
    /// `apply`, counts a broken stream as a bad request, and ticks when the client drives
    /// the clock.
    async fn ingest_stream<T>(
        &self,
        request: Request<Streaming<T>>,
        apply: impl Fn(&Shared, &T, &mut IngestAcc) -> Result<(), Status>,
    ) -> Result<Response<IngestReply>, Status> {
        self.sh.auth.check(&request)?;
        let driven = self.sh.drive_clock(&request);
        let mut s = request.into_inner();
        let mut acc = IngestAcc::default();
        loop {
            match s.message().await {
                Ok(Some(m)) => apply(&self.sh, &m, &mut acc)?,
                Ok(None) => break,
                Err(e) => {
                    self.sh.metrics.bad_requests.add("Ingest", 1);
                    return Err(e);
                }
            }
        }
        if driven {
            self.sh.tick();
        }
        Ok(Response::new(acc.into_reply()))
    }

    /// `IngestOne` through the generated prost server (a decoded batch).
    pub(super) fn ingest_one_decoded(
        &self,
        request: &Request<Batch>,
    ) -> Result<Response<IngestReply>, Status> {
        self.sh.auth.check(request)?;
        let driven = self.sh.drive_clock(request);
        let mut acc = IngestAcc::default();
        let b = request.get_ref();
        self.sh.apply(&b.records, &b.heartbeats, &mut acc);
        if driven {
            self.sh.tick();
        }
        Ok(Response::new(acc.into_reply()))
    }
}

#[tonic::async_trait]
impl RawIngest for Service {
    async fn ingest_raw(
        &self,
        request: Request<Streaming<Bytes>>,
    ) -> Result<Response<IngestReply>, Status> {
        self.ingest_stream(request, |sh, b: &Bytes, acc| {
            Ok(sh.apply_encoded(b, acc, "Ingest")?)
        })
        .await
    }

    async fn ingest_one_raw(
        &self,
        request: Request<Bytes>,
    ) -> Result<Response<IngestReply>, Status> {
        self.sh.auth.check(&request)?;
        let driven = self.sh.drive_clock(&request);
        let mut acc = IngestAcc::default();
        self.sh
            .apply_encoded(request.get_ref(), &mut acc, "IngestOne")?;
        if driven {
            self.sh.tick();
        }
        Ok(Response::new(acc.into_reply()))
    }
}
