//! A rank's current-collective words: four shared words next to its doorbell (or, for a
//! peer on another host, private words its socket proxy fills on request) where the
//! executor publishes the collective it runs, seqlock style. Word 0 is the collective's
//! sequence number plus one (0: none, or being rewritten), words 1 and 2 the rest of its
//! descriptor, word 3 the CPU the rank runs on plus one (0: unknown; never set for a remote
//! peer).

use std::sync::atomic::{fence, Ordering};

use super::shm::SharedWord;

/// Writes words 0-2: word 0 is cleared, words 1 and 2 written, then word 0 set to
/// `raw[0]` (Release).
pub(crate) fn store(w: &[SharedWord; 4], raw: [u64; 3]) {
    w[0].get().store(0, Ordering::Relaxed);
    fence(Ordering::Release);
    w[1].get().store(raw[1], Ordering::Relaxed);
    w[2].get().store(raw[2], Ordering::Relaxed);
    w[0].get().store(raw[0], Ordering::Release);
}

/// Words 0-2 as one consistent snapshot; `None` while they are being rewritten or when
/// the rank runs no collective (word 0 is 0).
pub(crate) fn load(w: &[SharedWord; 4]) -> Option<[u64; 3]> {
    let s1 = w[0].get().load(Ordering::Acquire);
    let (a, b) = (
        w[1].get().load(Ordering::Relaxed),
        w[2].get().load(Ordering::Relaxed),
    );
    fence(Ordering::Acquire);
    let s2 = w[0].get().load(Ordering::Relaxed);
    (s1 != 0 && s1 == s2).then_some([s1, a, b])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::ShmRegion;
    use std::sync::Arc;

    fn words() -> [SharedWord; 4] {
        let r = Arc::new(ShmRegion::anonymous(64).unwrap());
        [0, 8, 16, 24].map(|o| SharedWord::new(Arc::clone(&r), o).unwrap())
    }

    #[test]
    fn a_stored_snapshot_is_loaded_whole_and_zero_means_none() {
        let w = words();
        assert_eq!(load(&w), None);
        store(&w, [5, 6, 7]);
        assert_eq!(load(&w), Some([5, 6, 7]));
        store(&w, [0, 1, 2]);
        assert_eq!(load(&w), None);
    }
}
