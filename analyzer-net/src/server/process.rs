//! [`ShardProcess`]: a shard on a runtime thread of its own, killed outright as a crashed
//! process would be.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::{start, DiagnosisFeed, Feed, IncidentFeed, ServeError, ServerConfig, ServerHandle};
use crate::metrics::Metrics;
use ccld_wire::{Diagnosis, Incident};

/// A shard running on its own runtime thread, so that it can be killed outright
/// (every connection dropped) as a crashed process would be. Used by tests, benchmarks
/// and `ccld simulate --spawn`.
#[derive(Debug)]
pub struct ShardProcess {
    /// gRPC address.
    pub addr: SocketAddr,
    /// Metrics address.
    pub metrics_addr: Option<SocketAddr>,
    /// Metrics of the shard.
    pub metrics: Arc<Metrics>,
    rt: Option<tokio::runtime::Runtime>,
    handle: Option<ServerHandle>,
    diagnoses: broadcast::Sender<Diagnosis>,
    incidents: broadcast::Sender<Incident>,
}

impl ShardProcess {
    /// Starts a shard on a fresh multi-thread runtime with `workers` threads.
    pub fn spawn(
        cfg: ServerConfig,
        listen: SocketAddr,
        listener: Option<std::net::TcpListener>,
        workers: usize,
    ) -> Result<Self, ServeError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .enable_all()
            .thread_name("ccld-shard")
            .build()
            .map_err(ServeError::Runtime)?;
        let h = rt.block_on(start(cfg, listen, listener))?;
        Ok(Self {
            addr: h.addr,
            metrics_addr: h.metrics_addr,
            metrics: h.metrics.clone(),
            diagnoses: h.diagnoses.clone(),
            incidents: h.incidents.clone(),
            rt: Some(rt),
            handle: Some(h),
        })
    }

    /// A feed of the diagnoses this shard makes from now on.
    pub fn subscribe(&self) -> DiagnosisFeed {
        Feed::new(&self.diagnoses)
    }

    /// A feed of the incidents this shard makes from now on.
    pub fn subscribe_incidents(&self) -> IncidentFeed {
        Feed::new(&self.incidents)
    }

    /// Graceful stop (open calls get up to one second).
    pub fn stop(mut self) {
        if let (Some(rt), Some(h)) = (self.rt.take(), self.handle.take()) {
            let _ = rt.block_on(h.shutdown(Duration::from_secs(1)));
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }

    /// Abrupt stop: the runtime and every connection are dropped at once.
    pub fn kill(mut self) {
        self.handle.take();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(100));
        }
    }
}

impl Drop for ShardProcess {
    fn drop(&mut self) {
        self.handle.take();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_millis(100));
        }
    }
}
