//! Pure layout math and naming for shared-memory segments: no I/O, unit-tested exhaustively.

use crate::error::{CclError, Result};

/// Cache-line size every shared structure is aligned to (head and tail counters, slots,
/// doorbells), so that words written by different ranks never share a line.
pub const CACHE_LINE: usize = 64;

/// Longest accepted segment name (a file name under `/dev/shm`; NAME_MAX is 255).
pub const MAX_NAME_LEN: usize = 240;

/// Most slots one FIFO may have.
pub const MAX_SLOTS: usize = 1 << 16;

/// Largest slot one FIFO may have (1 GiB).
pub const MAX_SLOT_BYTES: usize = 1 << 30;

/// Rounds `v` up to a multiple of `align` (a power of two); `None` on overflow.
pub fn align_up(v: usize, align: usize) -> Option<usize> {
    debug_assert!(align.is_power_of_two());
    v.checked_add(align - 1).map(|x| x & !(align - 1))
}

/// Checks a segment name: 1..=[`MAX_NAME_LEN`] characters out of `[A-Za-z0-9._-]`, not
/// starting with `.` (so never `.`/`..` and never a hidden file).
pub fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(CclError::arg("shm segment name is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(CclError::arg(format!(
            "shm segment name is {} bytes long, at most {MAX_NAME_LEN} allowed",
            name.len()
        )));
    }
    if name.starts_with('.') {
        return Err(CclError::arg(format!(
            "shm segment name {name:?} must not start with '.'"
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(CclError::arg(format!(
            "shm segment name {name:?} contains {c:?}; only [A-Za-z0-9._-] are allowed"
        )));
    }
    Ok(())
}

/// Builds a segment name unique per communicator and creating process:
/// `<prefix>-<comm_hash as 16 hex digits>-<part>-<part>...-<pid>`.
///
/// Characters of `prefix` outside `[A-Za-z0-9._-]` become `_` and it is cut to 32 bytes, so
/// the result always passes [`validate_name`] (an empty prefix becomes `ccl`).
pub fn segment_name(prefix: &str, comm_hash: u64, parts: &[u64]) -> String {
    segment_name_for_pid(prefix, comm_hash, parts, std::process::id())
}

/// [`segment_name`] with an explicit pid (pure; used by tests and by a peer that knows the
/// creator's pid).
pub fn segment_name_for_pid(prefix: &str, comm_hash: u64, parts: &[u64], pid: u32) -> String {
    let mut out: String = prefix
        .chars()
        .take(32)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        out.push_str("ccl");
    }
    if out.starts_with('.') {
        out.replace_range(0..1, "_");
    }
    out.push_str(&format!("-{comm_hash:016x}"));
    // At most 8 parts keep the name within MAX_NAME_LEN: 32 + 17 + 8 * 21 + 11 = 228 < 240.
    for p in parts.iter().take(8) {
        out.push_str(&format!("-{p}"));
    }
    out.push_str(&format!("-{pid}"));
    out
}

/// Shape of one FIFO: `nslots` slots of `slot_bytes` each.
///
/// Bytes at the FIFO's offset (all relative to it):
/// - `0`: `head`, a `u64` count of slots committed by the producer (its own cache line),
/// - `64`: `tail`, a `u64` count of slots released by the consumer (its own cache line),
/// - `128`: `nslots` slot headers of [`FifoLayout::META_BYTES`] each (the `u64` byte count
///   committed into the slot, then [`FifoLayout::DESC_WORDS`] `u64` words of the operation
///   descriptor that travels with the slot's data), padded to a cache line,
/// - then the slots, each starting on a cache line, `slot_stride()` bytes apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FifoLayout {
    /// Number of slots (1..=[`MAX_SLOTS`]).
    pub nslots: usize,
    /// Usable bytes per slot (1..=[`MAX_SLOT_BYTES`]).
    pub slot_bytes: usize,
}

impl FifoLayout {
    /// Offset of the `head` counter.
    pub const HEAD_OFFSET: usize = 0;
    /// Offset of the `tail` counter.
    pub const TAIL_OFFSET: usize = CACHE_LINE;
    /// Offset of the first slot header (its length word).
    pub const LENS_OFFSET: usize = 2 * CACHE_LINE;
    /// Descriptor words after each slot's length word.
    pub const DESC_WORDS: usize = 3;
    /// Bytes of one slot header (length word + descriptor words).
    pub const META_BYTES: usize = 8 * (1 + Self::DESC_WORDS);

    /// Splits a buffer of `buff_bytes` (e.g. `NCCL_BUFFSIZE`) into `nslots` slots, each
    /// rounded down to a multiple of 64 bytes.
    pub fn for_buffer(buff_bytes: usize, nslots: usize) -> Result<FifoLayout> {
        if nslots == 0 {
            return Err(CclError::arg("FIFO needs at least one slot"));
        }
        let slot_bytes = (buff_bytes / nslots) & !(CACHE_LINE - 1);
        let layout = FifoLayout { nslots, slot_bytes };
        layout.validate()?;
        Ok(layout)
    }

    /// Checks the shape: slot count and size in range, total size representable.
    pub fn validate(&self) -> Result<()> {
        if self.nslots == 0 || self.nslots > MAX_SLOTS {
            return Err(CclError::arg(format!(
                "FIFO slot count {} is outside 1..={MAX_SLOTS}",
                self.nslots
            )));
        }
        if self.slot_bytes == 0 || self.slot_bytes > MAX_SLOT_BYTES {
            return Err(CclError::arg(format!(
                "FIFO slot size {} is outside 1..={MAX_SLOT_BYTES}",
                self.slot_bytes
            )));
        }
        self.checked_bytes()
            .map(|_| ())
            .ok_or_else(|| CclError::arg(format!("FIFO {self:?} does not fit in memory")))
    }

    /// Distance between consecutive slots (`slot_bytes` rounded up to 64).
    pub fn slot_stride(&self) -> usize {
        align_up(self.slot_bytes, CACHE_LINE).unwrap_or(usize::MAX)
    }

    /// Bytes of the header (head, tail, slot headers), a multiple of 64.
    pub fn header_bytes(&self) -> usize {
        self.nslots
            .checked_mul(Self::META_BYTES)
            .and_then(|l| align_up(l, CACHE_LINE))
            .and_then(|l| l.checked_add(Self::LENS_OFFSET))
            .unwrap_or(usize::MAX)
    }

    /// Offset of length word `i` (the start of slot `i`'s header).
    pub fn len_word_offset(&self, i: usize) -> usize {
        Self::LENS_OFFSET + Self::META_BYTES * i
    }

    /// Offset of descriptor word `w` (< [`FifoLayout::DESC_WORDS`]) of slot `i`.
    pub fn desc_word_offset(&self, i: usize, w: usize) -> usize {
        self.len_word_offset(i) + 8 * (1 + w)
    }

    /// Offset of slot `i`.
    pub fn slot_offset(&self, i: usize) -> usize {
        self.header_bytes() + i * self.slot_stride()
    }

    /// Total bytes, `None` on overflow.
    pub fn checked_bytes(&self) -> Option<usize> {
        let hdr = self
            .nslots
            .checked_mul(Self::META_BYTES)
            .and_then(|l| align_up(l, CACHE_LINE))?
            .checked_add(Self::LENS_OFFSET)?;
        let stride = align_up(self.slot_bytes, CACHE_LINE)?;
        hdr.checked_add(self.nslots.checked_mul(stride)?)
    }

    /// Total bytes the FIFO occupies (header + slots), a multiple of 64. Saturates at
    /// `usize::MAX` for absurd shapes, which then fail every bounds check.
    pub fn bytes(&self) -> usize {
        self.checked_bytes().unwrap_or(usize::MAX)
    }
}

/// Hands out 64-byte aligned offsets inside a segment being laid out, e.g.
/// `let mut c = Carve::new(); let bell = c.take(Doorbell::BYTES)?; let f = c.take(layout.bytes())?;`
/// then create the region with `c.total()` bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carve {
    next: usize,
}

impl Carve {
    /// An empty layout starting at offset 0.
    pub fn new() -> Carve {
        Carve { next: 0 }
    }

    /// Reserves `bytes` at the next cache-line boundary and returns their offset.
    pub fn take(&mut self, bytes: usize) -> Result<usize> {
        let at = self.next;
        self.next = bytes
            .checked_add(at)
            .and_then(|end| align_up(end, CACHE_LINE))
            .ok_or_else(|| CclError::arg(format!("segment layout overflows at {at}+{bytes}")))?;
        Ok(at)
    }

    /// Total bytes reserved so far (a multiple of 64).
    pub fn total(&self) -> usize {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_to_power_of_two() {
        assert_eq!(align_up(0, 64), Some(0));
        assert_eq!(align_up(1, 64), Some(64));
        assert_eq!(align_up(64, 64), Some(64));
        assert_eq!(align_up(65, 64), Some(128));
        assert_eq!(align_up(usize::MAX, 64), None);
        assert_eq!(align_up(usize::MAX - 63, 64), Some(usize::MAX - 63));
    }

    #[test]
    fn layout_math_matches_independent_formula() {
        for nslots in 1..=40usize {
            for slot_bytes in [1usize, 7, 63, 64, 65, 127, 128, 1000, 4096, 65536] {
                let l = FifoLayout { nslots, slot_bytes };
                l.validate().unwrap();
                // Independent reference: each piece rounded by division instead of masks.
                let lens = nslots * 32;
                let lens_padded = lens.div_ceil(64) * 64;
                let stride = slot_bytes.div_ceil(64) * 64;
                let header = 64 + 64 + lens_padded;
                assert_eq!(l.slot_stride(), stride);
                assert_eq!(l.header_bytes(), header);
                assert_eq!(l.bytes(), header + nslots * stride);
                assert_eq!(l.bytes() % 64, 0);
                // head and tail on separate lines, length words after both.
                assert_eq!(FifoLayout::HEAD_OFFSET / 64, 0);
                assert_eq!(FifoLayout::TAIL_OFFSET / 64, 1);
                assert!(l.len_word_offset(0) >= 128);
                assert!(l.desc_word_offset(nslots - 1, 2) + 8 <= l.header_bytes());
                for i in 0..nslots {
                    assert_eq!(l.len_word_offset(i), 128 + 32 * i);
                    assert_eq!(l.desc_word_offset(i, 0), 128 + 32 * i + 8);
                }
                for i in 0..nslots {
                    let s = l.slot_offset(i);
                    assert_eq!(s % 64, 0, "slot {i} aligned");
                    assert!(s >= l.header_bytes());
                    assert!(s + slot_bytes <= l.bytes());
                    if i + 1 < nslots {
                        assert!(s + slot_bytes <= l.slot_offset(i + 1), "slots disjoint");
                    }
                }
            }
        }
    }

    #[test]
    fn layout_rejects_bad_shapes() {
        for (n, b) in [
            (0, 64),
            (1, 0),
            (MAX_SLOTS + 1, 64),
            (1, MAX_SLOT_BYTES + 1),
            (usize::MAX, usize::MAX),
        ] {
            let l = FifoLayout {
                nslots: n,
                slot_bytes: b,
            };
            assert!(l.validate().is_err(), "{l:?}");
        }
        assert_eq!(
            FifoLayout {
                nslots: usize::MAX,
                slot_bytes: usize::MAX
            }
            .bytes(),
            usize::MAX
        );
        assert_eq!(
            FifoLayout {
                nslots: MAX_SLOTS,
                slot_bytes: MAX_SLOT_BYTES
            }
            .checked_bytes()
            .is_some(),
            cfg!(target_pointer_width = "64")
        );
    }

    #[test]
    fn for_buffer_splits_and_rounds_down() {
        let l = FifoLayout::for_buffer(4 << 20, 8).unwrap();
        assert_eq!(
            l,
            FifoLayout {
                nslots: 8,
                slot_bytes: 512 << 10
            }
        );
        let l = FifoLayout::for_buffer(1000, 3).unwrap();
        assert_eq!(l.slot_bytes, 320); // 333 rounded down to 64
        assert!(FifoLayout::for_buffer(100, 8).is_err()); // 12 bytes -> 0 after rounding
        assert!(FifoLayout::for_buffer(1 << 20, 0).is_err());
    }

    #[test]
    fn names_are_validated() {
        for ok in ["a", "ccl-00ff-1-2-33", "A.b_c-9", &"x".repeat(MAX_NAME_LEN)] {
            validate_name(ok).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "/abs",
            "sp ace",
            "nul\0",
            "é",
            "a*b",
            &"x".repeat(MAX_NAME_LEN + 1),
        ] {
            let e = validate_name(bad).unwrap_err();
            assert!(matches!(e, CclError::InvalidArgument(_)), "{bad:?}: {e}");
        }
    }

    #[test]
    fn segment_names_are_unique_and_valid() {
        let a = segment_name_for_pid("ccl", 0xabc, &[1, 2], 77);
        assert_eq!(a, "ccl-0000000000000abc-1-2-77");
        assert_ne!(a, segment_name_for_pid("ccl", 0xabc, &[1, 3], 77));
        assert_ne!(a, segment_name_for_pid("ccl", 0xabc, &[1, 2], 78));
        assert_ne!(a, segment_name_for_pid("ccl", 0xabd, &[1, 2], 77));
        assert_ne!(a, segment_name_for_pid("ccl", 0xabc, &[12], 77));
        let weird = segment_name_for_pid("/.bad name/é", u64::MAX, &[u64::MAX; 20], u32::MAX);
        validate_name(&weird).unwrap();
        assert!(weird.starts_with("_.bad_name__-ffffffffffffffff-"));
        validate_name(&segment_name_for_pid("", 0, &[], 0)).unwrap();
        validate_name(&segment_name_for_pid(".", 0, &[], 0)).unwrap();
        let long = "p".repeat(100);
        validate_name(&segment_name(&long, 1, &[u64::MAX; 8])).unwrap();
        assert!(segment_name("ccl", 1, &[]).ends_with(&format!("-{}", std::process::id())));
    }

    #[test]
    fn carve_aligns_every_piece() {
        let mut c = Carve::new();
        assert_eq!(c.take(8).unwrap(), 0);
        assert_eq!(c.take(1).unwrap(), 64);
        assert_eq!(c.take(0).unwrap(), 128);
        assert_eq!(c.take(200).unwrap(), 128);
        assert_eq!(c.total(), 384);
        assert!(c.take(usize::MAX).is_err());
    }
}
