//! The executor's side of by-reference sends to peers on other hosts
//! (`transport::socket::sendref`): which messages go by reference, the references an
//! operation has outstanding, and the rules that keep the proxy's reads of the user's
//! buffers sound: no write into a range whose message is unwritten ([`ByRef::blocks`]), no
//! completion before every message is written ([`ByRef::retire`]), and revocation of what
//! is left when the operation fails ([`ByRef::revoke`]).

use std::sync::Arc;
use std::time::Duration;

use crate::channel::Transport;
use crate::error::{CclError, Result};
use crate::transport::socket::sendref::SendRefs;

/// The smallest message sent by reference by default (`CCLD_SOCKET_SEND_BY_REF`): below it
/// the copy costs little, and the operation need not wait for the kernel at its end.
pub(crate) const BY_REF_MIN_BYTES: usize = 32 << 10;

/// How long a stream may stay broken with a message of the operation unwritten before
/// the operation fails on that alone. A dead peer is normally named first, by the peer
/// check (its control stream ends within the proxy's loss drain of 250 ms).
const BROKEN_GRACE: Duration = Duration::from_secs(2);

/// A message of the running operation sent by reference and not yet known written.
#[derive(Debug)]
struct PendingRef {
    refs: Arc<SendRefs>,
    seq: u64,
    peer: usize,
    addr: usize,
    len: usize,
}

/// The by-reference state of one communicator's executor.
#[derive(Debug)]
pub(crate) struct ByRef {
    /// Smallest message sent by reference (`usize::MAX`: none, `CCLD_SOCKET_SEND_BY_REF=0`).
    min: usize,
    pending: Vec<PendingRef>,
    /// When a pending message's stream was first seen broken ([`crate::executor::now_ns`]).
    broken_since: Option<u64>,
}

impl ByRef {
    /// From `CCLD_SOCKET_SEND_BY_REF` (the smallest message sent by reference, 0: none).
    pub(crate) fn from_env() -> Result<ByRef> {
        let min = crate::env::u64_or(
            &ccl_params::CCLD_SOCKET_SEND_BY_REF,
            BY_REF_MIN_BYTES as u64,
        )?;
        Ok(ByRef::new(match min {
            0 => usize::MAX,
            m => usize::try_from(m).unwrap_or(usize::MAX),
        }))
    }

    pub(crate) fn new(min: usize) -> ByRef {
        ByRef {
            min,
            pending: Vec::new(),
            broken_since: None,
        }
    }

    /// The table to post an `nb`-byte message of channel `ch` in, when it goes by
    /// reference: the link is remote (it has tables) and the message is large enough.
    pub(crate) fn table<'a>(
        &self,
        tables: &'a [Arc<SendRefs>],
        ch: usize,
        nb: usize,
    ) -> Option<&'a Arc<SendRefs>> {
        if nb < self.min {
            return None;
        }
        tables.get(ch)
    }

    /// Message `seq` of `refs` (to `peer`) is the `len` bytes at `addr`: posted before the
    /// slot is committed, and outstanding until written.
    pub(crate) fn post(
        &mut self,
        refs: &Arc<SendRefs>,
        seq: u64,
        peer: Option<usize>,
        addr: usize,
        len: usize,
    ) {
        refs.post(seq, addr, len);
        self.pending.push(PendingRef {
            refs: Arc::clone(refs),
            seq,
            peer: peer.unwrap_or(usize::MAX),
            addr,
            len,
        });
    }

    /// Whether nothing is outstanding.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether writing `len` bytes at `addr` must wait: an unwritten message refers to
    /// some of them.
    pub(crate) fn blocks(&self, addr: usize, len: usize) -> bool {
        self.pending.iter().any(|p| {
            len > 0 && addr < p.addr + p.len && p.addr < addr + len && !p.refs.written(p.seq)
        })
    }

    /// Forgets the messages now written; whether any was.
    pub(crate) fn retire(&mut self) -> bool {
        let before = self.pending.len();
        self.pending.retain(|p| !p.refs.written(p.seq));
        if self.pending.is_empty() {
            self.broken_since = None;
        }
        self.pending.len() < before
    }

    /// The peer of the oldest outstanding message (the one the operation waits on).
    pub(crate) fn oldest_peer(&self) -> Option<usize> {
        self.pending.first().map(|p| p.peer)
    }

    /// Fails the operation once a stream with an outstanding message has been broken for
    /// [`BROKEN_GRACE`] without the peer check naming a lost peer first.
    pub(crate) fn check_broken(&mut self, now_ns: u64) -> Result<()> {
        let Some(p) = self.pending.iter().find(|p| p.refs.broken()) else {
            self.broken_since = None;
            return Ok(());
        };
        let since = *self.broken_since.get_or_insert(now_ns);
        let grace = u64::try_from(BROKEN_GRACE.as_nanos()).unwrap_or(u64::MAX);
        if now_ns.saturating_sub(since) < grace {
            return Ok(());
        }
        Err(CclError::Remote(format!(
            "the connection to rank {} ended with {} bytes of this operation unsent",
            p.peer as i64, p.len
        )))
    }

    /// Revokes what is outstanding (the operation failed or panicked): once this returns,
    /// the proxy reads none of it (it holds its lock while it writes).
    #[inline]
    pub(crate) fn revoke(&mut self, t: &Transport) {
        // Every operation calls it; one with by-reference sends outstanding is rare.
        if !self.pending.is_empty() {
            self.revoke_while(|f| t.while_proxy_idle(f));
        }
    }

    /// [`ByRef::revoke`] once something is outstanding, with `while_idle` running its
    /// argument while the proxy is idle.
    #[inline(never)]
    fn revoke_while(&mut self, while_idle: impl FnOnce(&dyn Fn())) {
        let pending = &self.pending;
        while_idle(&|| {
            for p in pending {
                p.refs.revoke(p.seq);
            }
        });
        tracing::debug!(target: "nccl::NET", "revoked {} by-reference send(s) of a failed operation",
            self.pending.len());
        self.pending.clear();
        self.broken_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::socket::sendref::Payload;

    #[test]
    fn small_messages_and_local_links_are_copied() {
        let b = ByRef::new(BY_REF_MIN_BYTES);
        let tables = vec![Arc::new(SendRefs::new(4))];
        assert!(b.table(&tables, 0, BY_REF_MIN_BYTES - 1).is_none());
        assert!(b.table(&tables, 0, BY_REF_MIN_BYTES).is_some());
        assert!(
            b.table(&[], 0, 1 << 20).is_none(),
            "no tables: shared memory"
        );
        assert!(ByRef::new(usize::MAX).table(&tables, 0, 1 << 30).is_none());
    }

    #[test]
    fn a_range_is_blocked_until_its_message_is_written_then_retired() {
        let mut b = ByRef::new(1);
        let r = Arc::new(SendRefs::new(4));
        b.post(&r, 0, Some(1), 1000, 100);
        assert!(b.blocks(1050, 10));
        assert!(b.blocks(900, 101), "overlaps by one byte");
        assert!(!b.blocks(900, 100), "ends where the reference starts");
        assert!(!b.blocks(1100, 50), "starts where it ends");
        assert!(!b.retire());
        assert_eq!(b.oldest_peer(), Some(1));
        r.set_written(1);
        assert!(!b.blocks(1050, 10));
        assert!(b.retire());
        assert!(b.is_empty());
    }

    #[test]
    fn a_broken_stream_fails_the_operation_after_the_grace() {
        let mut b = ByRef::new(1);
        let r = Arc::new(SendRefs::new(4));
        b.post(&r, 0, Some(3), 0x1000, 64);
        assert!(b.check_broken(0).is_ok());
        r.set_broken();
        assert!(b.check_broken(10).is_ok(), "within the grace");
        let late = 10 + BROKEN_GRACE.as_nanos() as u64;
        let e = b.check_broken(late).unwrap_err().to_string();
        assert!(e.contains("rank 3") && e.contains("64 bytes"), "{e}");
    }

    #[test]
    fn revoking_marks_every_unwritten_message() {
        let mut b = ByRef::new(1);
        let r = Arc::new(SendRefs::new(4));
        b.post(&r, 0, Some(1), 0x1000, 64);
        b.post(&r, 1, Some(1), 0x2000, 64);
        r.set_written(1);
        let mut under_lock = false;
        b.revoke_while(|f| {
            under_lock = true;
            f()
        });
        assert!(under_lock);
        assert!(b.is_empty());
        assert!(
            matches!(r.payload(0), Payload::Ref { .. }),
            "written: left alone"
        );
        assert_eq!(r.payload(1), Payload::Revoked);
    }
}
