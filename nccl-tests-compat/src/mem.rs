//! Test buffers: host memory (the host backend) or device memory (when cudart reports a
//! device). All raw-pointer access to host buffers lives here.

use std::sync::Arc;

use crate::cuda::{Cuda, CudaError};

/// Where buffers live.
#[derive(Clone)]
pub enum Backend {
    /// Ordinary host memory.
    Host,
    /// CUDA device memory.
    Device(Arc<Cuda>),
}

/// One allocation.
pub struct Buffer {
    host: Vec<u64>,
    dev: usize,
    len: usize,
    backend: Backend,
}

impl Buffer {
    /// Allocates `len` bytes (zeroed on the host path), 8-byte aligned at least.
    ///
    /// Host buffers are written through once here (every page), so that they are backed by
    /// real memory before anything is timed, as device memory is. A zeroed allocation of
    /// this size comes from fresh anonymous pages that all read as the kernel's shared zero
    /// page until written: timing collectives on them measures reads of one cached page (and
    /// page faults inside the timed loop), whatever `-c` says.
    pub fn new(backend: &Backend, len: usize) -> Result<Buffer, CudaError> {
        match backend {
            Backend::Host => {
                let mut host = vec![0u64; len.div_ceil(8).max(1)];
                touch_pages(&mut host);
                Ok(Buffer {
                    host,
                    dev: 0,
                    len,
                    backend: Backend::Host,
                })
            }
            Backend::Device(c) => {
                let dev = c.malloc(len)?;
                Ok(Buffer {
                    host: Vec::new(),
                    dev,
                    len,
                    backend: backend.clone(),
                })
            }
        }
    }

    /// Byte length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address handed to NCCL.
    pub fn addr(&self) -> usize {
        match self.backend {
            Backend::Host => self.host.as_ptr() as usize,
            Backend::Device(_) => self.dev,
        }
    }

    fn bounds(&self, off: usize, n: usize) -> Result<(), CudaError> {
        if off.checked_add(n).is_some_and(|e| e <= self.len) {
            Ok(())
        } else {
            Err(CudaError {
                code: -1,
                call: "buffer access",
                message: format!("{off}+{n} beyond {}", self.len),
            })
        }
    }

    /// Copies `data` into the buffer at byte offset `off`.
    pub fn write(&mut self, off: usize, data: &[u8]) -> Result<(), CudaError> {
        self.bounds(off, data.len())?;
        match &self.backend {
            Backend::Host => {
                let bytes = host_bytes_mut(&mut self.host);
                bytes[off..off + data.len()].copy_from_slice(data);
                Ok(())
            }
            Backend::Device(c) => c.to_device(self.dev + off, data),
        }
    }

    /// Reads `n` bytes at byte offset `off`.
    pub fn read(&self, off: usize, n: usize) -> Result<Vec<u8>, CudaError> {
        self.bounds(off, n)?;
        match &self.backend {
            Backend::Host => Ok(host_bytes(&self.host)[off..off + n].to_vec()),
            Backend::Device(c) => {
                let mut v = vec![0u8; n];
                c.to_host(&mut v, self.dev + off)?;
                Ok(v)
            }
        }
    }

    /// Copies `n` bytes within the buffer (`src` and `dst` offsets; ranges may not overlap).
    pub fn copy_within(&mut self, src: usize, dst: usize, n: usize) -> Result<(), CudaError> {
        self.bounds(src, n)?;
        self.bounds(dst, n)?;
        match &self.backend {
            Backend::Host => {
                host_bytes_mut(&mut self.host).copy_within(src..src + n, dst);
                Ok(())
            }
            Backend::Device(c) => c.d2d(self.dev + dst, self.dev + src, n),
        }
    }

    /// Fills the whole buffer with `byte`.
    pub fn fill(&mut self, byte: u8) -> Result<(), CudaError> {
        let v = vec![byte; self.len];
        self.write(0, &v)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Backend::Device(c) = &self.backend {
            // A failed free at teardown cannot be acted on.
            let _ = c.free(self.dev);
        }
    }
}

/// Writes one word per 4 KiB (and the last word) of `v` with volatile stores, so that the
/// kernel backs every page with private memory. The stored value is the one already there
/// (zero), so contents are unchanged; `volatile` keeps the compiler from dropping stores it
/// can prove redundant after a zeroed allocation.
fn touch_pages(v: &mut [u64]) {
    const WORDS_PER_PAGE: usize = 4096 / 8;
    let n = v.len();
    let p = v.as_mut_ptr();
    let mut i = 0;
    while i < n {
        // SAFETY: i < n = v.len(), so p.add(i) is inside the unique borrow of `v`, aligned
        // for u64 (it is an element of a u64 slice).
        unsafe { std::ptr::write_volatile(p.add(i), 0) };
        i += WORDS_PER_PAGE;
    }
    if n > 0 {
        // SAFETY: n - 1 < v.len(), so p.add(n - 1) is the last element of the unique
        // borrow of `v`, aligned for u64.
        unsafe { std::ptr::write_volatile(p.add(n - 1), 0) };
    }
}

fn host_bytes(v: &[u64]) -> &[u8] {
    // SAFETY: a u64 slice is valid as bytes (u8 has no alignment or validity requirement),
    // length scaled accordingly, same lifetime.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 8) }
}

fn host_bytes_mut(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: a u64 slice is valid as bytes and any bytes are a valid u64, length scaled
    // accordingly; the unique borrow of `v` becomes the unique borrow of the bytes.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 8) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_buffer_round_trip_and_bounds() {
        let mut b = Buffer::new(&Backend::Host, 13).unwrap();
        assert_eq!(b.addr() % 8, 0);
        b.write(3, &[1, 2, 3]).unwrap();
        assert_eq!(b.read(2, 5).unwrap(), vec![0, 1, 2, 3, 0]);
        b.copy_within(3, 9, 3).unwrap();
        assert_eq!(b.read(9, 4).unwrap(), vec![1, 2, 3, 0]);
        assert!(b.write(12, &[1, 2]).is_err());
        assert!(b.read(14, 0).is_err());
        b.fill(7).unwrap();
        assert_eq!(b.read(0, 13).unwrap(), vec![7; 13]);
    }

    /// Pages of `[addr, addr + len)` that are resident (mincore), and the total.
    fn resident_pages(addr: usize, len: usize) -> (usize, usize) {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let start = addr / page * page;
        let end = (addr + len).div_ceil(page) * page;
        let n = (end - start) / page;
        let mut vec = vec![0u8; n];
        // SAFETY: the range is inside one live allocation (rounded out to whole pages, which
        // mincore requires and which are mapped since the allocation spans them); `vec` has
        // one byte per page, as mincore writes.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, end - start, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        (vec.iter().filter(|&&b| b & 1 == 1).count(), n)
    }

    /// Part of issue 18: host buffers must be backed by real memory before the timed loop
    /// (as device memory is), not by lazily mapped zero pages. A 64 MiB zeroed allocation
    /// is a fresh anonymous mapping with no page resident until written; `Buffer::new`
    /// must have written every page.
    #[test]
    fn host_buffer_pages_are_resident_after_allocation() {
        let len = 64 << 20;
        // The premise: a plain zeroed allocation of this size is not resident (if this
        // fails, the check below proves nothing on this system).
        let plain = vec![0u64; len / 8];
        let (res, total) = resident_pages(plain.as_ptr() as usize, len);
        assert!(
            res * 4 < total,
            "premise: a fresh zeroed allocation already has {res}/{total} pages resident"
        );
        drop(plain);
        let b = Buffer::new(&Backend::Host, len).unwrap();
        let (res, total) = resident_pages(b.addr(), b.len());
        assert_eq!(
            res, total,
            "{res} of {total} pages resident after Buffer::new"
        );
        assert_eq!(b.read(len - 16, 16).unwrap(), vec![0u8; 16]);
        assert_eq!(b.read(0, 16).unwrap(), vec![0u8; 16]);
    }
}
