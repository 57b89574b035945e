//! The two ends of a remote link's FIFOs that the socket proxy works on: the executor's
//! send FIFO, which the proxy reads and writes to the socket, and its receive FIFO, which
//! the proxy fills from the socket.

use std::sync::Arc;

use super::frame::DataHeader;
use super::sendref::{Payload, SendRefs};
use crate::error::{CclError, Result};
use crate::transport::shm::{FifoLayout, FifoReceiver, FifoSender, LlReceiver, LlSender};

/// The executor's send FIFO of a remote link, read by the proxy; a Simple FIFO's messages
/// may be references to the user's buffers ([`SendRefs`]).
#[derive(Debug)]
pub(crate) enum Outbound {
    Fifo(FifoReceiver, Arc<SendRefs>),
    Ll(LlReceiver),
}

impl Outbound {
    /// The next message to send: for a Simple FIFO the one after the `unacked` messages
    /// already sent (their slots stay taken until the peer's credit), for LL the next one.
    /// A referenced message's bytes are those of the user's buffer; a revoked one is an
    /// error (its operation failed, the buffer may be gone).
    #[allow(clippy::type_complexity)]
    pub(super) fn peek(
        &mut self,
        unacked: usize,
    ) -> Result<Option<(&[u8], [u64; FifoLayout::DESC_WORDS])>> {
        match self {
            Outbound::Fifo(f, refs) => {
                let seq = f.released() + unacked as u64;
                let Some((slot, desc)) = f.try_peek_ahead(unacked)? else {
                    return Ok(None);
                };
                match refs.payload(seq) {
                    Payload::Slot => Ok(Some((slot, desc))),
                    Payload::Ref { addr, len } if len == slot.len() => {
                        // SAFETY: the executor posted this range of an operation's buffer
                        // before committing the message (the commit's Release, our peek's
                        // Acquire), and keeps the operation from completing, and the range
                        // from being written, until `SendRefs::written` says the message
                        // is with the kernel; a failing operation revokes the reference
                        // under the lock this round holds before its error reaches the
                        // user (sendref.rs). The slice dies with this round's use of it.
                        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
                        Ok(Some((bytes, desc)))
                    }
                    Payload::Ref { len, .. } => Err(CclError::Internal(format!(
                        "message {seq} refers to {len} bytes but was committed with {}",
                        slot.len()
                    ))),
                    Payload::Revoked => Err(CclError::Aborted(format!(
                        "message {seq} was revoked: the operation that sent it failed"
                    ))),
                }
            }
            Outbound::Ll(f) => f.try_peek_with_desc(),
        }
    }

    /// The references of a Simple FIFO.
    pub(super) fn refs(&self) -> Option<&SendRefs> {
        match self {
            Outbound::Fifo(_, r) => Some(r),
            Outbound::Ll(_) => None,
        }
    }
}

/// The executor's receive FIFO of a remote link, filled by the proxy.
#[derive(Debug)]
pub(crate) enum Inbound {
    Fifo(FifoSender),
    Ll(LlSender),
}

impl Inbound {
    /// The largest message a slot holds.
    pub(super) fn cap(&self) -> usize {
        match self {
            Inbound::Fifo(f) => f.layout().slot_bytes,
            Inbound::Ll(f) => f.cap(),
        }
    }

    pub(super) fn reserve(&mut self) -> Option<&mut [u8]> {
        match self {
            Inbound::Fifo(f) => f.try_reserve(),
            Inbound::Ll(f) => f.try_reserve(),
        }
    }

    pub(super) fn commit(&mut self, h: &DataHeader) -> Result<()> {
        match self {
            Inbound::Fifo(f) => {
                // A slot is reserved and `h.len` fits it (checked by `DataHeader::decode`).
                f.commit_with_desc(h.len, h.desc);
                Ok(())
            }
            Inbound::Ll(f) => f.commit_with_desc(h.len, h.desc),
        }
    }
}
