//! Shared-memory transport primitives, between processes of one host and between threads of
//! one process: [`ShmRegion`] segments in `/dev/shm`, single-producer/single-consumer slot
//! FIFOs ([`FifoSender`]/[`FifoReceiver`]) with head/tail counters, futex [`Doorbell`]s and
//! a spin-yield-park [`Backoff`].
//!
//! Typical use, per ring link and channel: the consumer rank owns a doorbell and the FIFO
//! from its predecessor. The producer reserves a slot, writes or reduces into it, commits and
//! rings the consumer's doorbell; the consumer peeks, reads, releases and rings the
//! producer's doorbell. An executor thread reads its doorbell value, polls all its FIFOs and,
//! when none progressed, snoozes on the doorbell with the value read before polling.
//!
//! ```
//! use std::sync::Arc;
//! use ccl_core::internal::transport::shm::{Backoff, Carve, Doorbell, FifoLayout, FifoReceiver, FifoSender, ShmRegion};
//!
//! let layout = FifoLayout::for_buffer(64 << 10, 8)?; // NCCL_BUFFSIZE split into 8 slots
//! let mut c = Carve::new();
//! let bell_at = c.take(Doorbell::BYTES)?;
//! let fifo_at = c.take(layout.bytes())?;
//! // Between processes: ShmRegion::create(&segment_name(..), c.total()) here and
//! // ShmRegion::open(..) in the peer, which unlinks once everyone has mapped it.
//! let region = Arc::new(ShmRegion::anonymous(c.total())?);
//! let bell = Doorbell::new(region.clone(), bell_at)?; // the consumer's doorbell
//! let mut tx = FifoSender::new(region.clone(), fifo_at, layout)?;
//! let mut rx = FifoReceiver::new(region.clone(), fifo_at, layout)?;
//!
//! // Producer: reserve, fill, commit, ring.
//! let slot = tx.try_reserve().expect("empty FIFO has room");
//! slot[..5].copy_from_slice(b"hello");
//! tx.commit(5);
//! bell.ring();
//!
//! // Consumer: read the bell first, poll, snooze only if nothing moved.
//! let mut backoff = Backoff::new();
//! loop {
//!     let seen = bell.value();
//!     if let Some(data) = rx.try_peek() {
//!         assert_eq!(data, b"hello");
//!         rx.release();
//!         backoff.reset();
//!         break;
//!     }
//!     backoff.snooze(&bell, seen);
//! }
//! # Ok::<(), ccl_core::CclError>(())
//! ```
//!
//! All `unsafe` of the shared-memory path (mapping arithmetic, futex syscalls) is in this
//! module, each block with its `SAFETY` argument.

mod bell;
mod doorbell;
mod fifo;
mod layout;
mod ll;
mod region;
mod spsc;
mod word;

pub use doorbell::{Backoff, Doorbell};
pub use fifo::{FifoReceiver, FifoSender};
pub use layout::{
    align_up, segment_name, segment_name_for_pid, validate_name, Carve, FifoLayout, CACHE_LINE,
    MAX_NAME_LEN, MAX_SLOTS, MAX_SLOT_BYTES,
};
pub use ll::{LlLayout, LlReceiver, LlSender};
pub use region::{
    is_not_found, pid_alive, process_alive, remove_stale_segments, stale_candidate_pid, ShmRegion,
    NOT_FOUND_PREFIX, SHM_DIR,
};
pub use word::SharedWord;

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn handles_can_cross_threads() {
        send_sync::<ShmRegion>();
        send_sync::<Doorbell>();
        send::<FifoSender>();
        send::<FifoReceiver>();
        send::<Backoff>();
    }
}
