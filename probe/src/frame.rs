//! The probing frame (CCL-D section 5.1).
//!
//! One frame per rank, reused cyclically: a 32-byte header {operation counter, mode flag,
//! kernelIndex, nChannels} followed by [`FRAME_BLOCKS`] blocks. The operation with counter
//! `c` owns block `c % FRAME_BLOCKS`; a block holds the 16-byte [`TraceId`] and, per channel,
//! two consecutive `u64` slots SendCount and RecvCount. With 8 channels the frame is
//! 32 + 8 x (16 + 8 x 16) = 1184 bytes, the paper's figure.
//!
//! The `#[repr(C)]` structs below define the layout (the device kernels' C header mirrors
//! them). [`Frame`] is the runtime object: the same bytes held as `AtomicU64` words so that
//! one writer (the executor, or a kernel) and any number of readers (the diagnostic thread)
//! share it without locks.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Number of blocks in the frame body (operations in flight that can be told apart).
pub const FRAME_BLOCKS: usize = 8;
/// Channel count of the paper's reference frame (1184 bytes).
pub const PAPER_CHANNELS: usize = 8;
/// Size of the frame header in bytes.
pub const FRAME_HEADER_BYTES: usize = 32;

/// Labels one round (operation) of one communicator, identical on every rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId {
    /// 64-bit communicator id (hash of the unique id and the split lineage).
    pub comm_id: u64,
    /// Low 32 bits of the communicator's operation counter (the header has all 64).
    pub op_counter: u32,
    /// Extension field: flags or a coarse timestamp; 0 when unused.
    pub extension: u32,
}

/// Frame header layout.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FrameHeader {
    /// Operation counter of the operation most recently started on this rank.
    pub op_counter: u64,
    /// 1 while measurement is on, 0 when probing is disabled.
    pub mode: u32,
    /// Block of the current operation: `op_counter % FRAME_BLOCKS`.
    pub kernel_index: u32,
    /// Channels used by the current operation.
    pub n_channels: u32,
    /// Reserved, zero.
    pub reserved: [u32; 3],
}

/// One channel's progress counters inside a block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelCounts {
    /// Send steps completed by this channel in this operation.
    pub send_count: u64,
    /// Receive steps completed by this channel in this operation.
    pub recv_count: u64,
}

/// One body block: the Trace ID of the operation that owns it and per-channel counters.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FrameBlock<const C: usize> {
    /// Trace ID of the operation using this block.
    pub trace: TraceId,
    /// Per-channel counters.
    pub channels: [ChannelCounts; C],
}

/// The whole frame for `C` channels; `ProbingFrame<8>` is 1184 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProbingFrame<const C: usize> {
    /// Header.
    pub header: FrameHeader,
    /// Body, used cyclically.
    pub blocks: [FrameBlock<C>; FRAME_BLOCKS],
}

/// Bytes of a frame with `n_channels` channels.
pub const fn frame_bytes(n_channels: usize) -> usize {
    FRAME_HEADER_BYTES + FRAME_BLOCKS * block_bytes(n_channels)
}

/// Bytes of one block with `n_channels` channels.
pub const fn block_bytes(n_channels: usize) -> usize {
    16 + 16 * n_channels
}

/// Header as read by a sampler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameHeaderSnapshot {
    /// Operation counter of the most recently started operation.
    pub op_counter: u64,
    /// Measurement enabled.
    pub mode: bool,
    /// Block of the current operation.
    pub kernel_index: u32,
    /// Channels of the current operation.
    pub n_channels: u32,
}

// Word indices (u64 granularity) of the header fields; the layout test checks them against
// the repr(C) structs above.
const W_OP_COUNTER: usize = 0; // op_counter
const W_MODE_KINDEX: usize = 1; // mode (low 32 bits) | kernel_index (high 32 bits)
const W_NCHANNELS: usize = 2; // n_channels (low 32 bits) | reserved[0]
const HEADER_WORDS: usize = FRAME_HEADER_BYTES / 8;

/// A probing frame in memory, shared by one writer and lock-free readers.
///
/// Writer methods (`begin_op`, `add_send`, `add_recv`, `set_mode`) must be called by a single
/// thread at a time (the communicator's executor); readers may run concurrently on any
/// thread and see counts that only grow within one operation.
#[derive(Debug)]
pub struct Frame {
    /// Base layout words followed by the extension words (see [`EXT_WORDS_PER_CHANNEL`]).
    words: Words,
    n_channels: usize,
    /// Per block, how many leading channels the writer may have written since the block
    /// was last reset (every channel from there up is zero), so that `begin_op` resets
    /// only those: an operation on one channel of a 32-channel frame writes 7 words, not
    /// 224. Written by the single writer only. Not used for a frame over external memory
    /// (which a device kernel writes): every reset there clears the whole block.
    dirty: [AtomicUsize; FRAME_BLOCKS],
    /// Whether measurement is on: the authority behind the header's mode flag
    /// ([`Frame::set_mode`]), so that the writer publishes the header word with a plain
    /// store instead of a locked read-modify-write per operation.
    measuring: AtomicBool,
}

/// Called once when a frame over external memory is dropped (frees that memory).
pub type Release = Box<dyn FnOnce() + Send + Sync>;

/// The frame's words: a heap allocation of this crate, or external memory (pinned mapped
/// host memory a device kernel writes). Either way a pointer and a length, so reading a
/// word is the same plain slice access as with a `Box<[AtomicU64]>`.
struct Words {
    ptr: std::ptr::NonNull<AtomicU64>,
    len: usize,
    /// `None`: `ptr` came from `Box::into_raw` of a `Box<[AtomicU64]>` of length `len`.
    release: Option<Release>,
}

// SAFETY: the words are atomics (shared mutation through `&` is their purpose); the owned
// allocation or the external memory stays valid until `Drop`, whatever thread drops it;
// the release closure is `Send + Sync`.
unsafe impl Send for Words {}
// SAFETY: `&Words` only hands out `&[AtomicU64]` over memory that stays valid until
// `Drop`; atomics may be accessed from any number of threads at once.
unsafe impl Sync for Words {}

impl std::ops::Deref for Words {
    type Target = [AtomicU64];
    #[inline(always)]
    fn deref(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` points to `len` initialised, properly aligned AtomicU64 that live
        // until `Drop` (both constructors guarantee it).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for Words {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Words")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("external", &self.release.is_some())
            .finish()
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        match self.release.take() {
            Some(release) => release(),
            None => {
                let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
                // SAFETY: without a release closure the words came from Box::into_raw of a
                // boxed slice of exactly this pointer and length (Frame::new), dropped once.
                drop(unsafe { Box::from_raw(raw) });
            }
        }
    }
}

/// Extension words per channel and block, stored after the base layout (never inside it):
/// nanoseconds the channel waited for data from its upstream peer, and for a free slot at
/// its downstream peer (or for the throttled link), in the block's operation; then the send
/// and receive steps the schedule expects on the channel for the whole operation; then the
/// nanoseconds the channel's inbound messages spent on the wire (socket transport: from a
/// message's first byte to its last, measured by the receiving proxy; 0 elsewhere).
pub const EXT_WORDS_PER_CHANNEL: usize = 5;

/// Bytes of the extension area of a frame with `n_channels` channels.
pub const fn ext_bytes(n_channels: usize) -> usize {
    FRAME_BLOCKS * n_channels * EXT_WORDS_PER_CHANNEL * 8
}

/// One channel's wait times inside a block (extension slots).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelWaits {
    /// Nanoseconds spent waiting for upstream data.
    pub upstream_ns: u64,
    /// Nanoseconds spent waiting for downstream free slots.
    pub downstream_ns: u64,
    /// Nanoseconds the inbound messages spent on the wire (socket transport only).
    pub wire_ns: u64,
}

impl Frame {
    /// A zeroed frame with room for `n_channels` channels, measurement on.
    pub fn new(n_channels: usize) -> Self {
        let n_words = Self::total_bytes(n_channels) / 8;
        let words: Box<[AtomicU64]> = (0..n_words).map(|_| AtomicU64::new(0)).collect();
        let len = words.len();
        let raw = Box::into_raw(words) as *mut AtomicU64;
        // A boxed slice pointer is never null (dangling-but-aligned when empty).
        let ptr = std::ptr::NonNull::new(raw).unwrap_or(std::ptr::NonNull::dangling());
        let frame = Frame {
            words: Words {
                ptr,
                len,
                release: None,
            },
            n_channels,
            dirty: Default::default(),
            measuring: AtomicBool::new(false),
        };
        frame.set_mode(true);
        frame
    }

    /// Bytes a frame of `n_channels` channels occupies: the base layout
    /// ([`frame_bytes`]) followed by the extension slots ([`ext_bytes`]).
    pub const fn total_bytes(n_channels: usize) -> usize {
        frame_bytes(n_channels) + ext_bytes(n_channels)
    }

    /// A frame over external memory (for the device backend: pinned, mapped host memory
    /// whose device address a kernel writes the counters to, in the `ProbingFrame`
    /// layout). The memory is zeroed here, measurement turned on; `release` runs once when
    /// the frame is dropped (it frees the memory).
    ///
    /// # Safety
    /// `ptr` must be 8-byte aligned and valid for reads and writes of
    /// [`Frame::total_bytes`]`(n_channels)` bytes until `release` runs, and no Rust
    /// reference other than this frame's may access those bytes (other agents, such as a
    /// device kernel, may write the counter words with plain aligned 8-byte stores).
    pub unsafe fn from_external(ptr: *mut u64, n_channels: usize, release: Release) -> Frame {
        let len = Self::total_bytes(n_channels) / 8;
        let Some(ptr) = std::ptr::NonNull::new(ptr.cast::<AtomicU64>()) else {
            // A null pointer cannot satisfy the contract: fall back to owned memory rather
            // than dereference it (the release closure still runs once).
            release();
            return Frame::new(n_channels);
        };
        for i in 0..len {
            // SAFETY: i < len words inside the caller's valid, aligned range; AtomicU64 has
            // the layout of u64, so writing a fresh atomic initialises the word.
            unsafe { ptr.as_ptr().add(i).write(AtomicU64::new(0)) };
        }
        let frame = Frame {
            words: Words {
                ptr,
                len,
                release: Some(release),
            },
            n_channels,
            dirty: Default::default(),
            measuring: AtomicBool::new(false),
        };
        frame.set_mode(true);
        frame
    }

    /// Address of the first byte of the frame (the header), for handing its device-side
    /// alias to a kernel.
    pub fn as_ptr(&self) -> *const u64 {
        self.words.ptr.as_ptr().cast::<u64>()
    }

    /// Channel capacity of this frame.
    pub fn channel_capacity(&self) -> usize {
        self.n_channels
    }

    /// Size of the base frame in bytes (equals `size_of::<ProbingFrame<C>>()` for C
    /// channels); the extension slots come after it.
    pub fn size_bytes(&self) -> usize {
        frame_bytes(self.n_channels)
    }

    fn ext_word(&self, block: usize, channel: usize) -> usize {
        self.view().ext_word(block, channel)
    }

    /// The protocol's view of this frame's words.
    #[inline(always)]
    fn view(&self) -> View<'_, AtomicU64> {
        View {
            words: &self.words,
            n_channels: self.n_channels,
        }
    }

    /// Adds `ns` of waiting for upstream data to `channel` of `block` (extension slot).
    #[inline]
    pub fn add_wait_upstream(&self, block: usize, channel: usize, ns: u64) {
        self.touch(block, channel);
        if channel < self.n_channels {
            let w = &self.words[self.ext_word(block, channel)];
            w.store(w.load(Ordering::Relaxed) + ns, Ordering::Release);
        }
    }

    /// Adds `ns` of waiting for a downstream slot to `channel` of `block` (extension slot).
    #[inline]
    pub fn add_wait_downstream(&self, block: usize, channel: usize, ns: u64) {
        self.touch(block, channel);
        if channel < self.n_channels {
            let w = &self.words[self.ext_word(block, channel) + 1];
            w.store(w.load(Ordering::Relaxed) + ns, Ordering::Release);
        }
    }

    /// Adds `ns` of inbound messages on the wire to `channel` of `block` (extension slot).
    #[inline]
    pub fn add_wire(&self, block: usize, channel: usize, ns: u64) {
        self.touch(block, channel);
        if channel < self.n_channels {
            let w = &self.words[self.ext_word(block, channel) + 4];
            w.store(w.load(Ordering::Relaxed) + ns, Ordering::Release);
        }
    }

    /// Adds `send`/`recv` steps to what `channel` of `block` is expected to do in the
    /// block's operation (extension slots; the writer calls it right after `begin_op`, once
    /// per lane of the schedule).
    #[inline]
    pub fn add_expected(&self, block: usize, channel: usize, send: u64, recv: u64) {
        self.touch(block, channel);
        if channel < self.n_channels {
            let w = self.ext_word(block, channel);
            let (s, r) = (&self.words[w + 2], &self.words[w + 3]);
            s.store(s.load(Ordering::Relaxed) + send, Ordering::Release);
            r.store(r.load(Ordering::Relaxed) + recv, Ordering::Release);
        }
    }

    /// The steps the schedule expects on one channel of `block`: (send, recv); (0, 0) when
    /// unknown.
    pub fn expected(&self, block: usize, channel: usize) -> (u64, u64) {
        if channel >= self.n_channels {
            return (0, 0);
        }
        let w = self.ext_word(block, channel);
        (
            self.words[w + 2].load(Ordering::Acquire),
            self.words[w + 3].load(Ordering::Acquire),
        )
    }

    /// Reads one channel's wait times in `block`.
    pub fn waits(&self, block: usize, channel: usize) -> ChannelWaits {
        if channel >= self.n_channels {
            return ChannelWaits::default();
        }
        let w = self.ext_word(block, channel);
        ChannelWaits {
            upstream_ns: self.words[w].load(Ordering::Acquire),
            downstream_ns: self.words[w + 1].load(Ordering::Acquire),
            wire_ns: self.words[w + 4].load(Ordering::Acquire),
        }
    }

    /// Turns measurement on or off (the header's mode flag). Safe to call while another
    /// thread starts operations: the flag's authority is a word of its own, which the
    /// writer reads at every operation; the header's mode half follows here and at the
    /// writer's next `begin_op`, and [`Frame::header`] reports it off while the flag is
    /// off, whichever store the header word saw last.
    pub fn set_mode(&self, on: bool) {
        self.measuring.store(on, Ordering::Release);
        let w = &self.words[W_MODE_KINDEX];
        if on {
            w.fetch_or(1, Ordering::AcqRel);
        } else {
            w.fetch_and(!0xffff_ffff, Ordering::AcqRel);
        }
    }

    /// Whether measurement is on.
    pub fn is_measuring(&self) -> bool {
        self.measuring.load(Ordering::Acquire)
    }

    /// Starts operation `op_counter` of communicator `comm_id` on `n_channels` channels:
    /// claims block `op_counter % FRAME_BLOCKS`, writes its Trace ID, zeroes its counters,
    /// then publishes the header. Returns the block index.
    ///
    /// Channels beyond the frame's capacity are clamped (their progress is not recorded).
    #[inline]
    pub fn begin_op(&self, comm_id: u64, op_counter: u64, n_channels: usize) -> usize {
        let block = (op_counter % FRAME_BLOCKS as u64) as usize;
        let written = if self.words.release.is_some() {
            // External memory: the kernel's writes are not tracked.
            self.n_channels
        } else {
            let dirty = &self.dirty[block];
            let written = dirty.load(Ordering::Relaxed);
            dirty.store(n_channels.min(self.n_channels), Ordering::Relaxed);
            written
        };
        let mode = self.measuring.load(Ordering::Relaxed);
        self.view()
            .begin_op(comm_id, op_counter, n_channels, written, mode)
    }

    /// Notes that the writer writes `channel` of `block` (a channel past the operation's
    /// own count is still reset before the block is reused).
    #[inline(always)]
    fn touch(&self, block: usize, channel: usize) {
        if let Some(d) = self.dirty.get(block) {
            if channel >= d.load(Ordering::Relaxed) {
                d.store(channel + 1, Ordering::Relaxed);
            }
        }
    }

    /// Adds `n` completed send steps to `channel` of `block`.
    #[inline]
    pub fn add_send(&self, block: usize, channel: usize, n: u64) {
        self.touch(block, channel);
        self.view().add_count(block, channel, 0, n)
    }

    /// Adds `n` completed receive steps to `channel` of `block`.
    #[inline]
    pub fn add_recv(&self, block: usize, channel: usize, n: u64) {
        self.touch(block, channel);
        self.view().add_count(block, channel, 1, n)
    }

    /// Reads the header.
    pub fn header(&self) -> FrameHeaderSnapshot {
        let mut h = self.view().header();
        h.mode &= self.is_measuring();
        h
    }

    /// Reads the Trace ID stored in `block`.
    pub fn trace(&self, block: usize) -> TraceId {
        self.view().trace(block)
    }

    /// Reads one channel's counters in `block`.
    pub fn counts(&self, block: usize, channel: usize) -> ChannelCounts {
        self.view().counts(block, channel)
    }

    /// The base frame as raw little-endian bytes, in the `ProbingFrame` layout (without the
    /// extension slots).
    pub fn to_bytes(&self) -> Vec<u8> {
        self.words[..frame_bytes(self.n_channels) / 8]
            .iter()
            .flat_map(|w| w.load(Ordering::Acquire).to_le_bytes())
            .collect()
    }
}

/// One word of a frame: `AtomicU64` in the library, loom's atomics in the models.
pub(crate) trait FrameWord {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, v: u64, order: Ordering);
}

impl FrameWord for AtomicU64 {
    #[inline(always)]
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    #[inline(always)]
    fn store(&self, v: u64, order: Ordering) {
        AtomicU64::store(self, v, order)
    }
}

/// The frame's single-writer / many-readers protocol over any word type.
///
/// The writer (the executor, one thread per communicator rank) starts an operation by
/// zeroing its block's counters and writing its Trace ID (Relaxed), then publishing the
/// header with Release stores, the operation counter last; it bumps a counter with a
/// load and a Release store (it is the only writer). A reader (the diagnostic thread) that
/// Acquires the operation counter `c` sees block `c % FRAME_BLOCKS` reset and labelled for
/// `c` or a later operation that reused the block, and each counter only grows while the
/// block belongs to one operation. `loom_tests` checks this with loom's atomics.
struct View<'a, W> {
    words: &'a [W],
    n_channels: usize,
}

impl<W: FrameWord> View<'_, W> {
    #[inline(always)]
    fn block_word(&self, block: usize) -> usize {
        HEADER_WORDS + block * (block_bytes(self.n_channels) / 8)
    }

    #[inline(always)]
    fn count_word(&self, block: usize, channel: usize) -> usize {
        self.block_word(block) + 2 + 2 * channel
    }

    #[inline(always)]
    fn ext_word(&self, block: usize, channel: usize) -> usize {
        frame_bytes(self.n_channels) / 8
            + (block * self.n_channels + channel) * EXT_WORDS_PER_CHANNEL
    }

    /// Starts `op_counter` in its block, resetting the block's first `written` channels
    /// (the writer guarantees that every channel from `written` up is zero already).
    #[inline]
    fn begin_op(
        &self,
        comm_id: u64,
        op_counter: u64,
        n_channels: usize,
        written: usize,
        mode: bool,
    ) -> usize {
        let block = (op_counter % FRAME_BLOCKS as u64) as usize;
        let base = self.block_word(block);
        for ch in 0..written.min(self.n_channels) {
            self.words[base + 2 + 2 * ch].store(0, Ordering::Relaxed);
            self.words[base + 3 + 2 * ch].store(0, Ordering::Relaxed);
            let e = self.ext_word(block, ch);
            for w in &self.words[e..e + EXT_WORDS_PER_CHANNEL] {
                w.store(0, Ordering::Relaxed);
            }
        }
        self.words[base].store(comm_id, Ordering::Relaxed);
        // The Trace ID keeps the low 32 bits of the counter; the extension is unused (0).
        self.words[base + 1].store(op_counter & 0xffff_ffff, Ordering::Relaxed);
        let n_ch = n_channels.min(self.n_channels) as u64;
        self.words[W_NCHANNELS].store(n_ch, Ordering::Relaxed);
        // The writer owns the whole word: the mode half is the flag as it reads it
        // (`Frame::measuring` is the authority when `set_mode` races this store).
        self.words[W_MODE_KINDEX].store(u64::from(mode) | (block as u64) << 32, Ordering::Release);
        self.words[W_OP_COUNTER].store(op_counter, Ordering::Release);
        block
    }

    /// Adds `n` to the send (`which` 0) or receive (1) counter of `channel` in `block`.
    #[inline(always)]
    fn add_count(&self, block: usize, channel: usize, which: usize, n: u64) {
        if channel < self.n_channels {
            let w = &self.words[self.count_word(block, channel) + which];
            w.store(w.load(Ordering::Relaxed) + n, Ordering::Release);
        }
    }

    fn header(&self) -> FrameHeaderSnapshot {
        let op_counter = self.words[W_OP_COUNTER].load(Ordering::Acquire);
        let mk = self.words[W_MODE_KINDEX].load(Ordering::Acquire);
        let nch = self.words[W_NCHANNELS].load(Ordering::Acquire);
        FrameHeaderSnapshot {
            op_counter,
            mode: mk & 0xffff_ffff != 0,
            kernel_index: (mk >> 32) as u32,
            n_channels: (nch & 0xffff_ffff) as u32,
        }
    }

    fn trace(&self, block: usize) -> TraceId {
        let base = self.block_word(block);
        let w1 = self.words[base + 1].load(Ordering::Acquire);
        TraceId {
            comm_id: self.words[base].load(Ordering::Acquire),
            op_counter: (w1 & 0xffff_ffff) as u32,
            extension: (w1 >> 32) as u32,
        }
    }

    fn counts(&self, block: usize, channel: usize) -> ChannelCounts {
        if channel >= self.n_channels {
            return ChannelCounts::default();
        }
        let w = self.count_word(block, channel);
        ChannelCounts {
            send_count: self.words[w].load(Ordering::Acquire),
            recv_count: self.words[w + 1].load(Ordering::Acquire),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn paper_frame_is_1184_bytes_with_the_documented_offsets() {
        assert_eq!(size_of::<TraceId>(), 16);
        assert_eq!(size_of::<FrameHeader>(), FRAME_HEADER_BYTES);
        assert_eq!(size_of::<ChannelCounts>(), 16);
        assert_eq!(size_of::<FrameBlock<8>>(), 144);
        assert_eq!(size_of::<ProbingFrame<PAPER_CHANNELS>>(), 1184);
        assert_eq!(frame_bytes(PAPER_CHANNELS), 1184);

        assert_eq!(offset_of!(TraceId, comm_id), 0);
        assert_eq!(offset_of!(TraceId, op_counter), 8);
        assert_eq!(offset_of!(TraceId, extension), 12);
        assert_eq!(offset_of!(FrameHeader, op_counter), 0);
        assert_eq!(offset_of!(FrameHeader, mode), 8);
        assert_eq!(offset_of!(FrameHeader, kernel_index), 12);
        assert_eq!(offset_of!(FrameHeader, n_channels), 16);
        assert_eq!(offset_of!(FrameHeader, reserved), 20);
        assert_eq!(offset_of!(ChannelCounts, send_count), 0);
        assert_eq!(offset_of!(ChannelCounts, recv_count), 8);
        assert_eq!(offset_of!(FrameBlock<8>, trace), 0);
        assert_eq!(offset_of!(FrameBlock<8>, channels), 16);
        assert_eq!(offset_of!(ProbingFrame<8>, header), 0);
        assert_eq!(offset_of!(ProbingFrame<8>, blocks), 32);
        // Block b starts at 32 + 144 b; channel c of block b at 32 + 144 b + 16 + 16 c.
        for b in 0..FRAME_BLOCKS {
            assert_eq!(
                offset_of!(ProbingFrame<8>, blocks) + b * size_of::<FrameBlock<8>>(),
                32 + 144 * b
            );
        }
    }

    #[test]
    fn runtime_frame_matches_repr_c_layout_for_several_channel_counts() {
        fn check<const C: usize>() {
            let f = Frame::new(C);
            assert_eq!(f.size_bytes(), size_of::<ProbingFrame<C>>());
            let block = f.begin_op(0x1122_3344_5566_7788, 8 * 3 + 5, C);
            assert_eq!(block, 5);
            for ch in 0..C {
                f.add_send(block, ch, ch as u64 + 1);
                f.add_recv(block, ch, 100 + ch as u64);
            }
            let bytes = f.to_bytes();
            let rd = |off: usize| u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap());
            let rd32 = |off: usize| u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap());
            let h = offset_of!(ProbingFrame<C>, header);
            assert_eq!(rd(h + offset_of!(FrameHeader, op_counter)), 29);
            assert_eq!(rd32(h + offset_of!(FrameHeader, mode)), 1);
            assert_eq!(rd32(h + offset_of!(FrameHeader, kernel_index)), 5);
            assert_eq!(rd32(h + offset_of!(FrameHeader, n_channels)), C as u32);
            let b = offset_of!(ProbingFrame<C>, blocks) + 5 * size_of::<FrameBlock<C>>();
            assert_eq!(rd(b + offset_of!(TraceId, comm_id)), 0x1122_3344_5566_7788);
            assert_eq!(rd32(b + offset_of!(TraceId, op_counter)), 29);
            for ch in 0..C {
                let c = b + offset_of!(FrameBlock<C>, channels) + ch * size_of::<ChannelCounts>();
                assert_eq!(rd(c), ch as u64 + 1);
                assert_eq!(rd(c + 8), 100 + ch as u64);
            }
        }
        check::<1>();
        check::<2>();
        check::<8>();
        check::<32>();
    }

    #[test]
    fn begin_op_resets_the_reused_block_and_keeps_other_blocks() {
        let f = Frame::new(2);
        let b0 = f.begin_op(7, 0, 2);
        f.add_send(b0, 0, 3);
        let b1 = f.begin_op(7, 1, 2);
        f.add_recv(b1, 1, 4);
        let b8 = f.begin_op(7, 8, 1);
        assert_eq!(b8, b0);
        assert_eq!(f.counts(b8, 0), ChannelCounts::default());
        assert_eq!(f.counts(b1, 1).recv_count, 4);
        assert_eq!(f.trace(b8).op_counter, 8);
        let h = f.header();
        assert_eq!((h.op_counter, h.kernel_index, h.n_channels), (8, 0, 1));
        // Out-of-range channels are ignored, never out of bounds.
        f.add_send(b8, 5, 1);
        assert_eq!(f.counts(b8, 5), ChannelCounts::default());
    }

    #[test]
    fn a_reset_clears_every_channel_written_since_the_last_one_and_only_those() {
        let f = Frame::new(4);
        let full = f.to_bytes();
        // Operation 0 on 3 channels; operation 8 (same block) on one channel, which also
        // writes a channel past its own count; operation 16 on one channel again.
        let b = f.begin_op(7, 0, 3);
        for ch in 0..3 {
            f.add_send(b, ch, 5);
            f.add_wait_upstream(b, ch, 9);
            f.add_expected(b, ch, 2, 2);
        }
        assert_eq!(f.begin_op(7, 8, 1), b);
        for ch in 0..4 {
            assert_eq!(f.counts(b, ch), ChannelCounts::default(), "channel {ch}");
            assert_eq!(f.waits(b, ch), ChannelWaits::default(), "channel {ch}");
            assert_eq!(f.expected(b, ch), (0, 0), "channel {ch}");
        }
        f.add_recv(b, 0, 1);
        f.add_wire(b, 3, 4);
        f.begin_op(7, 16, 1);
        assert_eq!(f.counts(b, 0), ChannelCounts::default());
        assert_eq!(
            f.waits(b, 3),
            ChannelWaits::default(),
            "written past the count"
        );
        // Nothing but the header and the Trace ID differs from a fresh frame's words.
        let now = f.to_bytes();
        let block0 = FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + 16;
        for (i, (a, z)) in now.iter().zip(&full).enumerate() {
            if i >= FRAME_HEADER_BYTES && !block0.contains(&i) {
                assert_eq!(a, z, "byte {i}");
            }
        }
    }

    #[test]
    fn extension_slots_lie_after_the_base_layout_and_reset_with_the_block() {
        let f = Frame::new(2);
        let b = f.begin_op(1, 3, 2);
        let before = f.to_bytes();
        f.add_wait_upstream(b, 1, 70);
        f.add_wait_downstream(b, 1, 5);
        f.add_wait_downstream(b, 1, 6);
        f.add_wire(b, 1, 5);
        f.add_wire(b, 7, 1); // out of range: ignored
        f.add_wait_upstream(b, 9, 1); // out of range: ignored
        f.add_expected(b, 1, 6, 4);
        f.add_expected(b, 1, 1, 0);
        f.add_expected(b, 7, 1, 1); // out of range: ignored
        assert_eq!(
            f.to_bytes(),
            before,
            "extension slots never touch the base layout"
        );
        assert_eq!(f.expected(b, 1), (7, 4));
        assert_eq!((f.expected(b, 0), f.expected(b, 7)), ((0, 0), (0, 0)));
        assert_eq!(
            f.waits(b, 1),
            ChannelWaits {
                upstream_ns: 70,
                downstream_ns: 11,
                wire_ns: 5,
            }
        );
        assert_eq!(f.waits(b, 0), ChannelWaits::default());
        let other = f.begin_op(1, 4, 2);
        f.add_wait_upstream(other, 0, 2);
        assert_eq!(f.waits(b, 1).upstream_ns, 70, "other blocks untouched");
        f.begin_op(1, 3 + FRAME_BLOCKS as u64, 2);
        assert_eq!(f.waits(b, 1), ChannelWaits::default(), "reused block reset");
        assert_eq!(f.expected(b, 1), (0, 0), "expected counts reset too");
        assert_eq!(ext_bytes(8), 8 * 8 * 40);
    }

    #[test]
    fn frame_over_external_memory_has_the_same_layout_and_releases_once() {
        use std::sync::Arc;
        let words = Frame::total_bytes(2) / 8;
        let mut mem: Vec<u64> = vec![0xdead_beef; words];
        let ptr = mem.as_mut_ptr();
        let released = Arc::new(AtomicUsize::new(0));
        let r2 = Arc::clone(&released);
        // SAFETY: `mem` is aligned, has total_bytes(2) bytes and outlives the frame; it is
        // only read through raw reads below while the frame exists.
        let f = unsafe {
            Frame::from_external(
                ptr,
                2,
                Box::new(move || {
                    r2.fetch_add(1, Ordering::SeqCst);
                }),
            )
        };
        assert_eq!(f.as_ptr(), ptr as *const u64);
        assert!(f.is_measuring());
        let owned = Frame::new(2);
        for fr in [&f, &owned] {
            let b = fr.begin_op(9, 11, 2);
            fr.add_send(b, 1, 4);
            fr.add_recv(b, 0, 2);
            fr.add_expected(b, 1, 5, 6);
        }
        assert_eq!(f.to_bytes(), owned.to_bytes());
        // A foreign writer (the kernel) stores absolute counts at the C ABI's offsets:
        // SendCount of channel ch in block b at 32 + b * (16 + 16 cap) + 16 + 16 ch.
        let off = (FRAME_HEADER_BYTES + 3 * block_bytes(2) + 16 + 16) / 8;
        // SAFETY: in bounds of `mem`; a plain aligned store like the kernel's.
        unsafe { ptr.add(off).write_volatile(77) };
        assert_eq!(f.counts(3, 1).send_count, 77);
        drop(f);
        assert_eq!(released.load(Ordering::SeqCst), 1);
        drop(mem);
    }

    #[test]
    fn mode_flag_round_trips_without_touching_kernel_index() {
        let f = Frame::new(1);
        f.begin_op(1, 3, 1);
        f.set_mode(false);
        assert!(!f.is_measuring());
        assert_eq!(f.header().kernel_index, 3);
        f.set_mode(true);
        assert!(f.header().mode);
        // A writer that read the flag on just before a pause publishes the header word
        // with the mode on after `set_mode(false)` cleared it: the header still reads off.
        f.set_mode(false);
        f.view().begin_op(1, 4, 1, 1, true);
        let h = f.header();
        assert!(!h.mode && !f.is_measuring());
        assert_eq!((h.op_counter, h.kernel_index), (4, 4));
        f.set_mode(true);
        assert!(f.header().mode);
    }

    #[test]
    fn a_concurrent_reader_sees_monotonic_counts() {
        use std::sync::Arc;
        let f = Arc::new(Frame::new(1));
        let block = f.begin_op(1, 0, 1);
        let reader = {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                let mut last = 0;
                for _ in 0..10_000 {
                    let c = f.counts(block, 0).send_count;
                    assert!(c >= last);
                    last = c;
                }
            })
        };
        for _ in 0..100_000 {
            f.add_send(block, 0, 1);
        }
        reader.join().unwrap();
        assert_eq!(f.counts(block, 0).send_count, 100_000);
    }
}

/// Loom model of the frame's writer / diagnostic-thread reader protocol ([`View`]): a
/// 1-channel frame whose block 0 is used by operation 0 (two sends) and then reused by
/// operation 8 (one send), against a reader sampling the header, the Trace ID and the
/// counts, in every interleaving and reordering the memory model allows.
#[cfg(test)]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicU64 as LoomU64;
    use loom::sync::Arc;

    impl FrameWord for LoomU64 {
        fn load(&self, order: Ordering) -> u64 {
            LoomU64::load(self, order)
        }
        fn store(&self, v: u64, order: Ordering) {
            LoomU64::store(self, v, order)
        }
    }

    const COMM: u64 = 0xc0;

    #[test]
    fn a_reader_never_sees_a_published_operation_with_stale_trace_or_counts() {
        // Every interleaving with at most 3 preemptions (the full space takes minutes):
        // enough to put the reader between any two stores of the writer.
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let words: Arc<Vec<LoomU64>> = Arc::new(
                (0..Frame::total_bytes(1) / 8)
                    .map(|_| LoomU64::new(0))
                    .collect(),
            );
            let w2 = Arc::clone(&words);
            let writer = loom::thread::spawn(move || {
                let v = View {
                    words: &w2[..],
                    n_channels: 1,
                };
                let b = v.begin_op(COMM, 0, 1, 1, true);
                v.add_count(b, 0, 0, 1);
                v.add_count(b, 0, 0, 1);
                let b8 = v.begin_op(COMM, 8, 1, 1, true);
                assert_eq!(b8, b, "operation 8 reuses block 0");
                v.add_count(b8, 0, 0, 1);
            });
            let v = View {
                words: &words[..],
                n_channels: 1,
            };
            let h = v.header();
            let t = v.trace(0);
            let c1 = v.counts(0, 0).send_count;
            let c2 = v.counts(0, 0).send_count;
            if h.op_counter == 8 {
                // Published after the reset and the new label: nothing of operation 0.
                assert_eq!((t.comm_id, t.op_counter, h.kernel_index), (COMM, 8, 0));
                assert!(
                    c1 <= 1 && c1 <= c2,
                    "counts {c1}, {c2} after operation 8 started"
                );
            }
            writer.join().unwrap();
            let end = v.header();
            assert_eq!((end.op_counter, v.counts(0, 0).send_count), (8, 1));
        });
    }
}
