//! The poison board of a device communicator (the descriptor check's last resort): one
//! word in a shared-memory segment that every rank maps (the device path is single-host).
//! A rank whose kernel found a mismatch stores its poison there (the first one stays); the
//! liveness watch of every rank reads it while operations are in flight and fails them.
//! The kernels' poison messages reach only the ranks on the failing kernel's connections;
//! the board reaches the others (a Send whose receiver rejected it, a rank that already
//! had all of a collective, then waits in its next call), within one watch period.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::runtime::{sweep_stale_staging, STAGING_PREFIX};
use crate::bootstrap::Bootstrap;
use crate::desc::{poison_decode, poison_value, Poison};
use crate::error::Result;
use crate::transport::shm::{segment_name_for_pid, SharedWord, ShmRegion};

/// The name part that tells a board from the staging segments (which have three parts).
const BOARD_PART: u64 = 0xB0A2D;

/// One communicator's poison word.
#[derive(Debug)]
pub struct Board {
    word: SharedWord,
}

impl Board {
    /// Every rank calls it at init (collective over the bootstrap): rank 0 creates the
    /// segment, the others map it, and rank 0 unlinks the name once all have it (a job
    /// that dies later leaves nothing in `/dev/shm`). `None` for a single rank.
    pub(crate) fn setup(boot: &Bootstrap, comm: u64) -> Result<Option<Board>> {
        if boot.nranks() < 2 {
            return Ok(None);
        }
        let name = segment_name_for_pid(STAGING_PREFIX, comm, &[BOARD_PART], boot.peer_pid(0));
        let region = if boot.rank() == 0 {
            sweep_stale_staging();
            let r = ShmRegion::create(&name, 64)?;
            boot.barrier()?;
            r
        } else {
            boot.barrier()?;
            ShmRegion::open_timeout(&name, Duration::from_secs(10))?
        };
        let region = Arc::new(region);
        let word = SharedWord::new(Arc::clone(&region), 0)?;
        boot.barrier()?;
        if boot.rank() == 0 {
            region.unlink()?;
        }
        Ok(Some(Board { word }))
    }

    /// This rank's descriptor check failed: poisons the communicator (unless a rank did
    /// first).
    pub fn poison(&self, rank: usize) {
        // Release: pairs with the Acquire in `poisoned_by`.
        let _ = self.word.get().compare_exchange(
            0,
            poison_value(rank, 0),
            Ordering::Release,
            Ordering::Relaxed,
        );
    }

    /// The rank that poisoned the communicator, if one did.
    pub fn poisoned_by(&self) -> Option<usize> {
        match poison_decode(self.word.get().load(Ordering::Acquire))? {
            Poison::Inconsistent { by, .. } => Some(by),
            Poison::PeerLost { .. } => None,
        }
    }
}
