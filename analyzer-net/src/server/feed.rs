//! What a shard makes, read in-process without an RPC: [`DiagnosisFeed`] (the shard's
//! `Watch` broadcast, for a process that runs a shard and surfaces its diagnoses itself, as
//! the embedded hub of `probe` does) and [`IncidentFeed`] (what a process hosting a shard
//! prints for the user, `CCLD_REPORT`).

use tokio::sync::broadcast::{self, error::TryRecvError};

use ccld_wire::{Diagnosis, Incident};

/// The items of one kind a shard makes from the moment of subscription on, each once.
#[derive(Debug)]
pub struct Feed<T> {
    rx: broadcast::Receiver<T>,
    lagged: u64,
}

/// The diagnoses a shard makes from the moment of subscription on.
pub type DiagnosisFeed = Feed<Diagnosis>;
/// The incidents a shard makes from the moment of subscription on.
pub type IncidentFeed = Feed<Incident>;

impl<T: Clone> Feed<T> {
    pub(super) fn new(tx: &broadcast::Sender<T>) -> Self {
        Self {
            rx: tx.subscribe(),
            lagged: 0,
        }
    }

    /// The next item if one is waiting (never blocks). Items the feed could not keep (more
    /// than the shard's broadcast capacity, 1024, unread) are skipped and counted in
    /// [`Self::lagged`]; `None` also once the shard has stopped.
    pub fn try_next(&mut self) -> Option<T> {
        loop {
            match self.rx.try_recv() {
                Ok(d) => return Some(d),
                Err(TryRecvError::Lagged(n)) => self.lagged += n,
                Err(TryRecvError::Empty | TryRecvError::Closed) => return None,
            }
        }
    }

    /// Items skipped because the reader fell behind.
    pub fn lagged(&self) -> u64 {
        self.lagged
    }
}
