//! By-reference sends of the socket transport: a message to a remote peer can leave from
//! the user's buffer instead of a copy in the send slot.
//!
//! Over shared memory the executor copies every outbound chunk into the peer's slot. Over
//! sockets the "slot" is private memory that only this process's proxy reads, and it
//! writes the bytes to the kernel anyway, so the executor may instead note where the
//! bytes are ([`SendRefs::post`], before it commits the slot, which it leaves unwritten)
//! and the proxy writes them from there ([`SendRefs::payload`]). The slot stays the unit
//! of flow control: the proxy releases it at the peer's credit, as for a copied message.
//!
//! The contract, kept by the executor (`executor_byref.rs`, `ByRef`):
//! - a referenced range is not written while its message is unwritten
//!   ([`SendRefs::written`]): a step that would write into it waits;
//! - an operation does not complete while a message it referenced is unwritten (the
//!   user may reuse the buffer as soon as the call returns), or the stream broke
//!   ([`SendRefs::broken`]);
//! - an operation that fails first revokes its unwritten references
//!   ([`SendRefs::revoke`]) while it holds the proxy's lock (the proxy writes only while
//!   it holds it), so that once the error reaches the user no byte of the buffer is read
//!   again; the proxy then ends that stream, since the message cannot be completed.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// One slot's reference: the message number it belongs to (+1, 0: none) and where its
/// bytes are.
#[derive(Debug, Default)]
struct Entry {
    tag: AtomicU64,
    addr: AtomicUsize,
    len: AtomicUsize,
}

/// Set in a tag whose reference was revoked.
const REVOKED: u64 = 1 << 63;

/// What the proxy finds for a message of the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Payload {
    /// The bytes are in the slot (copied by the executor).
    Slot,
    /// The bytes are `len` bytes at `addr`, in a buffer of an operation in flight.
    Ref { addr: usize, len: usize },
    /// The operation that referenced them failed: they must not be read.
    Revoked,
}

/// The references of one outbound Simple FIFO of a remote link, shared by the executor
/// (which posts them) and the proxy (which writes them), indexed by message number.
#[derive(Debug)]
pub(crate) struct SendRefs {
    entries: Box<[Entry]>,
    /// Messages of the stream (copied or referenced) whose bytes are all with the kernel.
    written: AtomicU64,
    /// The stream ended or failed: what was not written never will be.
    broken: AtomicBool,
}

impl SendRefs {
    /// For a FIFO of `nslots` slots.
    pub(crate) fn new(nslots: usize) -> SendRefs {
        SendRefs {
            entries: (0..nslots.max(1)).map(|_| Entry::default()).collect(),
            written: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        }
    }

    fn entry(&self, seq: u64) -> &Entry {
        // The length is at least 1 (`new`); the remainder is below it.
        &self.entries[(seq % self.entries.len() as u64) as usize]
    }

    /// Executor: message `seq` (the FIFO's next commit, whose slot is reserved) is the
    /// `len` bytes at `addr`. The commit that follows publishes this (Release).
    pub(crate) fn post(&self, seq: u64, addr: usize, len: usize) {
        let e = self.entry(seq);
        e.addr.store(addr, Ordering::Relaxed);
        e.len.store(len, Ordering::Relaxed);
        e.tag.store(seq + 1, Ordering::Relaxed);
    }

    /// Proxy: where message `seq` (committed: its slot was peeked) has its bytes.
    pub(crate) fn payload(&self, seq: u64) -> Payload {
        let e = self.entry(seq);
        match e.tag.load(Ordering::Relaxed) {
            t if t == seq + 1 => Payload::Ref {
                addr: e.addr.load(Ordering::Relaxed),
                len: e.len.load(Ordering::Relaxed),
            },
            t if t == (seq + 1) | REVOKED => Payload::Revoked,
            _ => Payload::Slot,
        }
    }

    /// Proxy: messages `..n` are written. Whether the last of them was referenced (an
    /// executor may wait for it: ring its doorbell).
    pub(crate) fn set_written(&self, n: u64) -> bool {
        self.written.store(n, Ordering::Release);
        n > 0 && self.entry(n - 1).tag.load(Ordering::Relaxed) == n
    }

    /// Whether message `seq` is written: the kernel has its bytes, and a referenced
    /// buffer may be reused (Acquire: the proxy's reads of it happened before).
    pub(crate) fn written(&self, seq: u64) -> bool {
        self.written.load(Ordering::Acquire) > seq
    }

    /// Proxy: the stream ended; unwritten messages stay unwritten.
    pub(crate) fn set_broken(&self) {
        self.broken.store(true, Ordering::Release);
    }

    pub(crate) fn broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Executor, holding the proxy's lock: message `seq` must not be read any more, unless
    /// it is written already.
    pub(crate) fn revoke(&self, seq: u64) {
        let e = self.entry(seq);
        if !self.written(seq) && e.tag.load(Ordering::Relaxed) == seq + 1 {
            e.tag.store((seq + 1) | REVOKED, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posted_reference_is_found_until_its_slot_is_reused() {
        let r = SendRefs::new(4);
        assert_eq!(r.payload(0), Payload::Slot);
        r.post(1, 0x1000, 64);
        assert_eq!(r.payload(0), Payload::Slot);
        assert_eq!(
            r.payload(1),
            Payload::Ref {
                addr: 0x1000,
                len: 64
            }
        );
        // Message 5 takes message 1's slot: copied, it must not be mistaken for the
        // old reference.
        assert_eq!(r.payload(5), Payload::Slot);
    }

    #[test]
    fn written_counts_messages_and_says_when_the_last_was_referenced() {
        let r = SendRefs::new(2);
        r.post(1, 0x2000, 8);
        assert!(!r.written(0));
        assert!(!r.set_written(1), "message 0 was copied");
        assert!(r.written(0) && !r.written(1));
        assert!(r.set_written(2), "message 1 was referenced");
        assert!(r.written(1));
    }

    #[test]
    fn a_revoked_reference_is_never_read_but_a_written_one_stays() {
        let r = SendRefs::new(4);
        r.post(0, 0x3000, 16);
        r.post(1, 0x4000, 16);
        r.set_written(1);
        r.revoke(0);
        r.revoke(1);
        assert_eq!(
            r.payload(0),
            Payload::Ref {
                addr: 0x3000,
                len: 16
            },
            "written before the revocation"
        );
        assert_eq!(r.payload(1), Payload::Revoked);
        assert!(!r.set_written(2), "a revoked message does not wake anyone");
    }
}
