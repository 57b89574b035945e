//! What the kernels' descriptor check found (issue 17 on the device backend): the record
//! a kernel leaves in the communicator's check area (`CCL_DESC_WORDS` in `ccl_device.h`)
//! turned into the operation's error and the probe's failure, with the host backend's
//! texts ([`crate::desc`]). Pure: the caller reads the area.

use kernels::ffi::{
    ccl_check_record_offset, CCL_DESC_POISON_MARK, CCL_DESC_WORDS, CCL_MAX_CHANNELS,
};
use probe::{Failure, FailureCause};

use super::lower::ConnKey;
use crate::desc::{Mismatch, OpDesc};
use crate::error::CclError;

/// One channel's record: the connection index and the descriptor words that arrived and
/// that this rank expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Channel (block) that saw it.
    pub channel: usize,
    /// Index into the plan's connections.
    pub conn: usize,
    /// What arrived.
    pub got: [u64; CCL_DESC_WORDS],
    /// What this rank's call expected.
    pub want: [u64; CCL_DESC_WORDS],
}

/// The first channel's record in a check area given as its words (`None`: the check found
/// nothing). `area` holds `CCL_CHECK_BYTES / 8` words.
pub fn first_record(area: &[u64]) -> Option<Record> {
    (0..CCL_MAX_CHANNELS).find_map(|ch| {
        let at = ccl_check_record_offset(ch) / 8;
        let r = area.get(at..at + 2 + 2 * CCL_DESC_WORDS)?;
        (r[0] != 0).then(|| {
            let mut got = [0; CCL_DESC_WORDS];
            let mut want = [0; CCL_DESC_WORDS];
            got.copy_from_slice(&r[2..2 + CCL_DESC_WORDS]);
            want.copy_from_slice(&r[2 + CCL_DESC_WORDS..]);
            Record {
                channel: ch,
                conn: r[1] as usize,
                got,
                want,
            }
        })
    })
}

/// The rank that sent a poison descriptor, `None` for any other descriptor.
pub fn poisoned_by(got: &[u64; CCL_DESC_WORDS]) -> Option<usize> {
    (got[1] >> 56 == CCL_DESC_POISON_MARK).then_some((got[1] & 0xFF_FFFF) as usize)
}

/// The error of a rank (`who`) that fails because rank `by`'s descriptor check failed
/// (a poison message or the poison board).
pub fn poisoned_error(by: usize, who: &str) -> CclError {
    CclError::Remote(format!(
        "rank {by} detected an inconsistent call and failed; {who} fails too: the \
         communicator is unusable"
    ))
}

/// The operation's error and the probe's failure for record `r` of `rank` (`conns`: the
/// plan's connections, to name the peer):
/// - a mismatch: `ncclInvalidUsage` with the host backend's text (both ranks, both
///   descriptors), cause INCONSISTENT with both descriptors;
/// - a poison: `ncclRemoteError` naming the rank that failed first, cause PEER_FAILED.
pub fn failure_of(r: &Record, conns: &[ConnKey], rank: usize, comm_id: u64) -> (CclError, Failure) {
    let peer = conns.get(r.conn).map_or(usize::MAX, |k| k.peer);
    if let Some(by) = poisoned_by(&r.got) {
        let who = format!(
            "rank {rank} (poison from rank {peer}, channel {})",
            r.channel
        );
        return (
            poisoned_error(by, &who),
            Failure::cause(FailureCause::PeerFailed),
        );
    }
    let Some(local) = OpDesc::decode(r.want) else {
        return (
            CclError::Internal(format!(
                "descriptor check on channel {}: this rank's descriptor {:x?} is malformed",
                r.channel, r.want
            )),
            Failure::cause(FailureCause::Internal),
        );
    };
    let m = Mismatch {
        peer,
        channel: r.channel,
        local,
        remote: OpDesc::decode(r.got),
    };
    (
        CclError::InvalidUsage(m.text(rank, comm_id)),
        Failure {
            cause: FailureCause::Inconsistent,
            peer_lost: None,
            mismatch: Some(m.to_probe()),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::lower::ConnDir;
    use crate::schedule::LinkKind;
    use ccl_optype::CollKind;
    use kernels::ffi::CCL_CHECK_BYTES;

    fn desc(coll: CollKind, count: u64) -> OpDesc {
        OpDesc {
            seq: 4,
            coll,
            dtype: 7,
            redop: if coll == CollKind::AllReduce { 0 } else { -1 },
            count,
            root: -1,
        }
    }

    fn area_with(ch: usize, conn: u64, got: [u64; 3], want: [u64; 3]) -> Vec<u64> {
        let mut a = vec![0u64; CCL_CHECK_BYTES / 8];
        let at = ccl_check_record_offset(ch) / 8;
        a[at] = 1;
        a[at + 1] = conn;
        a[at + 2..at + 5].copy_from_slice(&got);
        a[at + 5..at + 8].copy_from_slice(&want);
        a
    }

    fn conns() -> Vec<ConnKey> {
        vec![
            ConnKey {
                link: LinkKind::Ring,
                peer: 3,
                channel: 1,
                dir: ConnDir::Out,
            },
            ConnKey {
                link: LinkKind::Ring,
                peer: 1,
                channel: 1,
                dir: ConnDir::In,
            },
        ]
    }

    #[test]
    fn an_empty_area_found_nothing_and_the_first_channel_wins() {
        assert_eq!(first_record(&vec![0; CCL_CHECK_BYTES / 8]), None);
        let mut a = area_with(5, 1, [1, 2, 3], [4, 5, 6]);
        let b = area_with(2, 0, [7, 8, 9], [1, 1, 1]);
        a[ccl_check_record_offset(2) / 8..ccl_check_record_offset(3) / 8]
            .copy_from_slice(&b[ccl_check_record_offset(2) / 8..ccl_check_record_offset(3) / 8]);
        let r = first_record(&a).unwrap();
        assert_eq!(
            (r.channel, r.conn, r.got, r.want),
            (2, 0, [7, 8, 9], [1, 1, 1])
        );
        // A short area is no record, not a panic.
        assert_eq!(first_record(&a[..10]), None);
    }

    #[test]
    fn a_mismatch_names_both_ranks_and_both_calls() {
        let mine = desc(CollKind::AllReduce, 1024).encode();
        let theirs = desc(CollKind::AllGather, 256).encode();
        let r = first_record(&area_with(1, 1, theirs, mine)).unwrap();
        let (e, f) = failure_of(&r, &conns(), 2, 0xabc);
        assert!(matches!(e, CclError::InvalidUsage(_)), "{e}");
        assert!(crate::desc::breaks_comm(&e), "{e}");
        let t = e.to_string();
        assert!(
            t.contains("rank 2 called AllReduce seq 4 count 1024"),
            "{t}"
        );
        assert!(t.contains("rank 1 called AllGather seq 4 count 256"), "{t}");
        assert_eq!(f.cause, FailureCause::Inconsistent);
        let m = f.mismatch.unwrap();
        assert_eq!((m.peer_rank, m.channel), (1, 1));
        assert_eq!(m.remote.unwrap().count, 256);
    }

    #[test]
    fn a_poison_names_the_rank_that_failed_first() {
        let mine = desc(CollKind::AllReduce, 1024).encode();
        let poison = [!0, (CCL_DESC_POISON_MARK << 56) | 6, 0];
        assert_eq!(poisoned_by(&poison), Some(6));
        assert_eq!(poisoned_by(&mine), None);
        let r = first_record(&area_with(0, 1, poison, mine)).unwrap();
        let (e, f) = failure_of(&r, &conns(), 2, 0xabc);
        assert!(matches!(e, CclError::Remote(_)), "{e}");
        assert!(
            e.to_string()
                .contains("rank 6 detected an inconsistent call"),
            "{e}"
        );
        assert_eq!(f.cause, FailureCause::PeerFailed);
    }
}
