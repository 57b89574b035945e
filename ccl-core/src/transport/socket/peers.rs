//! What the socket proxy knows of each peer's connection: open, closed with a goodbye, or
//! lost (and why), read by the executor's peer check.

use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;

/// What the proxy knows of each peer's connection (indexed by rank).
#[derive(Debug)]
pub(crate) struct PeerStates {
    state: Vec<AtomicU8>,
    reason: Mutex<Vec<Option<String>>>,
}

const OPEN: u8 = 0;
pub(super) const CLOSED: u8 = 1;
pub(super) const LOST: u8 = 2;

impl PeerStates {
    pub(crate) fn new(n: usize) -> PeerStates {
        PeerStates {
            state: (0..n).map(|_| AtomicU8::new(OPEN)).collect(),
            reason: Mutex::new(vec![None; n]),
        }
    }

    /// Why the connection to `peer` was lost (`None`: open, or closed with a goodbye).
    pub(crate) fn lost(&self, peer: usize) -> Option<String> {
        if self.state.get(peer)?.load(Ordering::Acquire) != LOST {
            return None;
        }
        Some(
            self.reason.lock()[peer]
                .clone()
                .unwrap_or_else(|| "connection lost".into()),
        )
    }

    pub(super) fn mark(&self, peer: usize, to: u8, why: Option<String>) {
        let Some(s) = self.state.get(peer) else {
            return;
        };
        if s.load(Ordering::Acquire) != OPEN {
            return;
        }
        self.reason.lock()[peer] = why;
        s.store(to, Ordering::Release);
    }
}
