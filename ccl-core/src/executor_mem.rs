//! Raw access to user buffers. The C API's contract (NCCL's) is that every buffer is valid
//! for the sizes implied by the operation's arguments until the operation completes, and
//! the caller blocks in `group_end` until then; schedules only address units inside those
//! sizes (checked by the schedule simulation tests).

/// # Safety
/// `addr + off .. + len` must be readable for the returned lifetime and not written
/// through any other reference while the slice lives.
pub(super) unsafe fn src<'a>(addr: usize, off: usize, len: usize) -> &'a [u8] {
    // SAFETY: forwarded to the caller (see the function contract); addr is non-null
    // for any operation that moves bytes (validated by group::validate).
    unsafe { std::slice::from_raw_parts((addr + off) as *const u8, len) }
}

/// # Safety
/// `addr + off .. + len` must be writable for the returned lifetime and not accessed
/// through any other reference while the slice lives.
pub(super) unsafe fn dst<'a>(addr: usize, off: usize, len: usize) -> &'a mut [u8] {
    // SAFETY: as for `src`, for writing.
    unsafe { std::slice::from_raw_parts_mut((addr + off) as *mut u8, len) }
}

/// memmove of `len` bytes (ranges may overlap or coincide).
///
/// # Safety
/// Both ranges must be valid for `len` bytes.
pub(super) unsafe fn copy(src: usize, dst: usize, len: usize) {
    if src != dst && len > 0 {
        // SAFETY: both ranges valid (caller); ptr::copy allows overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) }
    }
}

/// Reads `len` bytes at `addr` (a device-resident PreMulSum scalar on the host backend).
///
/// # Safety
/// `addr` must be readable for `len` bytes.
pub(super) unsafe fn read_bytes(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: this function's contract: `addr .. addr + len` is readable; u8 needs no
    // alignment, and the bytes are copied out before returning.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

pub(super) fn overlap(a: usize, b: usize, len: usize) -> bool {
    len > 0 && a < b + len && b < a + len
}
