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
//! All `unsafe` of the shared-memory path (mapping arithmetic, futex syscalls) is in this
//! module, each block with its `SAFETY` argument.

mod doorbell;
mod fifo;
mod layout;
mod region;

pub use doorbell::{Backoff, Doorbell};
pub use fifo::{FifoReceiver, FifoSender};
pub use layout::{
    align_up, segment_name, segment_name_for_pid, validate_name, Carve, FifoLayout, CACHE_LINE,
    MAX_NAME_LEN, MAX_SLOTS, MAX_SLOT_BYTES,
};
pub use region::{is_not_found, pid_alive, ShmRegion, NOT_FOUND_PREFIX, SHM_DIR};
