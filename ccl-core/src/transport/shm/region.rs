//! Shared-memory segments: a file under `/dev/shm` mapped read-write (or an anonymous mapping
//! for ranks that are threads of one process), plus the in-process bookkeeping that keeps the
//! safe accessors of this module sound.

use parking_lot::Mutex;
use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::ops::Range;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};

use super::layout::{validate_name, FifoLayout, CACHE_LINE};
use crate::error::{CclError, Result};

/// Directory holding named segments.
pub const SHM_DIR: &str = "/dev/shm";

/// "CCLSHM01" little-endian: written last by the creator, so a peer that sees it also sees
/// the length word.
const MAGIC: u64 = u64::from_le_bytes(*b"CCLSHM01");

/// Prefix of the error text of [`ShmRegion::open`] when the segment does not exist (yet).
pub const NOT_FOUND_PREFIX: &str = "shm segment not found";

/// Who holds a byte range of a region inside this process. FIFO ends hand out `&mut [u8]` /
/// `&[u8]` views of their slots, so two live ends of the same kind (or two FIFOs that
/// overlap, or an atomic word inside a FIFO) would alias; claims turn that into an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ClaimKind {
    /// The producer end of the FIFO at this offset with this layout.
    FifoSend(FifoLayout),
    /// The consumer end of the FIFO at this offset with this layout.
    FifoRecv(FifoLayout),
    /// The producer end of the LL FIFO at this offset with this layout.
    LlSend(super::ll::LlLayout),
    /// The consumer end of the LL FIFO at this offset with this layout.
    LlRecv(super::ll::LlLayout),
    /// Atomic words of `width` bytes (doorbells: 4, `atomic_u64`: 8); several handles to
    /// the same range with the same width are fine, mixed-size access is refused.
    Atomic { width: u8 },
    /// Bytes handed to a device (host-staged device FIFOs, [`ShmRegion::claim_for_device`]):
    /// only kernels and raw-pointer code access them; no safe view may overlap.
    Device,
}

#[derive(Debug)]
struct Claim {
    range: Range<usize>,
    kind: ClaimKind,
    /// Live handles; FIFO ends are exclusive (1), atomic claims count handles.
    refs: usize,
}

fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

/// Whether a new claim may coexist with an existing overlapping one.
fn compatible(old: &Claim, range: &Range<usize>, kind: ClaimKind) -> bool {
    match (old.kind, kind) {
        (ClaimKind::FifoSend(a), ClaimKind::FifoRecv(b))
        | (ClaimKind::FifoRecv(a), ClaimKind::FifoSend(b)) => old.range == *range && a == b,
        (ClaimKind::LlSend(a), ClaimKind::LlRecv(b))
        | (ClaimKind::LlRecv(a), ClaimKind::LlSend(b)) => old.range == *range && a == b,
        _ => false,
    }
}

/// Header at the start of every mapping; user offsets start after it.
const HEADER_BYTES: usize = CACHE_LINE;
const MAGIC_OFFSET: usize = 0;
const LEN_OFFSET: usize = 8;
const PID_OFFSET: usize = 16;

/// A shared-memory segment mapped read-write.
///
/// Named segments live in `/dev/shm/<name>`; the creating handle unlinks the file when it is
/// dropped (unless [`ShmRegion::unlink`] already did, or the name now names another file),
/// so a crashed or finished job leaves nothing behind once its creators are gone. Peers
/// should still call `unlink` as soon as every peer has mapped the segment.
///
/// Offsets passed to the FIFO/doorbell constructors are relative to the user area of
/// [`ShmRegion::len`] bytes, which starts 64-byte aligned (after a small private header).
pub struct ShmRegion {
    map: MmapRaw,
    name: String,
    path: Option<PathBuf>,
    /// Usable bytes (after the header).
    len: usize,
    /// (device, inode) of the file, to never unlink a newer file that reuses the name.
    file_id: Option<(u64, u64)>,
    created: bool,
    unlinked: AtomicBool,
    claims: Mutex<Vec<Claim>>,
}

impl std::fmt::Debug for ShmRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmRegion")
            .field("name", &self.name)
            .field("len", &self.len)
            .field("created", &self.created)
            .finish_non_exhaustive()
    }
}

/// Outcome of one attempt to open a named segment.
enum OpenAttempt {
    Ready(ShmRegion),
    /// Missing, or created but not initialised yet: try again later.
    NotYet(String),
}

impl ShmRegion {
    /// Creates `/dev/shm/<name>` (`O_CREAT|O_EXCL`, mode 0600) with `len` zeroed usable bytes
    /// and maps it. Fails if the name is invalid, `len` is 0, or the file already exists.
    pub fn create(name: &str, len: usize) -> Result<ShmRegion> {
        validate_name(name)?;
        let total = total_len(len)?;
        let path = PathBuf::from(SHM_DIR).join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| {
                if e.kind() == ErrorKind::AlreadyExists {
                    CclError::System(format!("shm segment {} already exists", path.display()))
                } else {
                    CclError::sys(&format!("creating shm segment {}", path.display()), e)
                }
            })?;
        // From here on the file exists: remove it again if anything below fails.
        let cleanup = |e: CclError| {
            let _ = std::fs::remove_file(&path);
            e
        };
        // ftruncate zero-fills; /dev/shm (tmpfs) allocates pages lazily.
        file.set_len(total as u64).map_err(|e| {
            cleanup(CclError::sys(
                &format!("sizing shm segment {} to {total} bytes", path.display()),
                e,
            ))
        })?;
        reserve_pages(&file, total).map_err(|e| {
            cleanup(CclError::System(format!(
                "cannot reserve {total} bytes for shm segment {}: {e} \
                 ({SHM_DIR} too small? e.g. docker --shm-size)",
                path.display()
            )))
        })?;
        let meta = file
            .metadata()
            .map_err(|e| cleanup(CclError::sys("stat of new shm segment", e)))?;
        let map = MmapOptions::new().len(total).map_raw(&file).map_err(|e| {
            cleanup(CclError::sys(
                &format!("mapping shm segment {}", path.display()),
                e,
            ))
        })?;
        let region = ShmRegion {
            map,
            name: name.to_string(),
            path: Some(path),
            len,
            file_id: Some((meta.dev(), meta.ino())),
            created: true,
            unlinked: AtomicBool::new(false),
            claims: Mutex::new(Vec::new()),
        };
        region
            .header_u64(LEN_OFFSET)
            .store(len as u64, Ordering::Relaxed);
        region
            .header_u64(PID_OFFSET)
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        // Release: a peer that reads MAGIC with Acquire sees the words above.
        region
            .header_u64(MAGIC_OFFSET)
            .store(MAGIC, Ordering::Release);
        tracing::debug!(target: "nccl::SHM", name, len, "created shm segment");
        Ok(region)
    }

    /// Maps the existing segment `/dev/shm/<name>`.
    ///
    /// A segment that does not exist, or exists but whose creator has not finished
    /// initialising it, gives `CclError::System` whose text starts with
    /// [`NOT_FOUND_PREFIX`] (see [`is_not_found`]); callers retry, or use
    /// [`ShmRegion::try_open`] / [`ShmRegion::open_timeout`].
    pub fn open(name: &str) -> Result<ShmRegion> {
        match Self::open_attempt(name)? {
            OpenAttempt::Ready(r) => Ok(r),
            OpenAttempt::NotYet(why) => Err(CclError::System(format!(
                "{NOT_FOUND_PREFIX}: {SHM_DIR}/{name} ({why})"
            ))),
        }
    }

    /// Like [`ShmRegion::open`], but `Ok(None)` while the segment is missing or not yet
    /// initialised; other failures (bad name, corrupt header, mmap failure) are errors.
    pub fn try_open(name: &str) -> Result<Option<ShmRegion>> {
        match Self::open_attempt(name)? {
            OpenAttempt::Ready(r) => Ok(Some(r)),
            OpenAttempt::NotYet(_) => Ok(None),
        }
    }

    /// Retries [`ShmRegion::try_open`] (sleeping 1 ms between tries) until the segment is
    /// ready or `timeout` passes (`CclError::Timeout` naming the segment).
    pub fn open_timeout(name: &str, timeout: Duration) -> Result<ShmRegion> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = Self::try_open(name)? {
                return Ok(r);
            }
            if Instant::now() >= deadline {
                return Err(CclError::Timeout(format!(
                    "shm segment {SHM_DIR}/{name} did not appear within {timeout:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn open_attempt(name: &str) -> Result<OpenAttempt> {
        validate_name(name)?;
        let path = PathBuf::from(SHM_DIR).join(name);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Ok(OpenAttempt::NotYet("no such file".into()))
            }
            Err(e) => {
                return Err(CclError::sys(
                    &format!("opening shm segment {}", path.display()),
                    e,
                ))
            }
        };
        let meta = file
            .metadata()
            .map_err(|e| CclError::sys(&format!("stat of shm segment {}", path.display()), e))?;
        let size = meta.len();
        if size < (HEADER_BYTES + CACHE_LINE) as u64 {
            // Created but not sized yet (or a foreign file): the creator sizes before it
            // publishes, so this is "not yet".
            return Ok(OpenAttempt::NotYet(format!("only {size} bytes so far")));
        }
        let total = usize::try_from(size).map_err(|_| {
            CclError::System(format!(
                "shm segment {} is too large to map",
                path.display()
            ))
        })?;
        let map = MmapOptions::new()
            .len(total)
            .map_raw(&file)
            .map_err(|e| CclError::sys(&format!("mapping shm segment {}", path.display()), e))?;
        let mut region = ShmRegion {
            map,
            name: name.to_string(),
            path: Some(path),
            len: 0,
            file_id: Some((meta.dev(), meta.ino())),
            created: false,
            unlinked: AtomicBool::new(false),
            claims: Mutex::new(Vec::new()),
        };
        if region.header_u64(MAGIC_OFFSET).load(Ordering::Acquire) != MAGIC {
            return Ok(OpenAttempt::NotYet(
                "creator has not initialised it yet".into(),
            ));
        }
        let len = region.header_u64(LEN_OFFSET).load(Ordering::Relaxed);
        if total_len_u64(len) != Some(size) {
            return Err(CclError::System(format!(
                "shm segment {SHM_DIR}/{name} is corrupt: header says {len} usable bytes, file has {size}"
            )));
        }
        // Cannot truncate: total_len_u64 checked len + header == size, which fits usize.
        region.len = len as usize;
        tracing::debug!(target: "nccl::SHM", name, len, "opened shm segment");
        Ok(OpenAttempt::Ready(region))
    }

    /// An anonymous mapping of `len` zeroed bytes, for ranks that are threads of this process
    /// (it is not inherited as shared memory by `fork`). `name()` is `anon`.
    pub fn anonymous(len: usize) -> Result<ShmRegion> {
        let total = total_len(len)?;
        let map = MmapOptions::new()
            .len(total)
            .map_anon()
            .map_err(|e| CclError::sys(&format!("anonymous mapping of {total} bytes"), e))?;
        Ok(ShmRegion {
            map: MmapRaw::from(map),
            name: "anon".to_string(),
            path: None,
            len,
            file_id: None,
            created: true,
            unlinked: AtomicBool::new(true),
            claims: Mutex::new(Vec::new()),
        })
    }

    /// Removes the file name from `/dev/shm`; the mapping stays valid for everyone who has
    /// it. Idempotent: a file that is already gone (or replaced by another file of the same
    /// name) is not an error and is left alone.
    pub fn unlink(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if self.unlinked.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match std::fs::metadata(path) {
            Ok(m) if Some((m.dev(), m.ino())) == self.file_id => {}
            Ok(_) => return Ok(()), // the name now belongs to another segment
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                self.unlinked.store(false, Ordering::Release);
                return Err(CclError::sys(&format!("stat of {}", path.display()), e));
            }
        }
        match std::fs::remove_file(path) {
            Ok(()) => {
                tracing::debug!(target: "nccl::SHM", name = %self.name, "unlinked shm segment");
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => {
                self.unlinked.store(false, Ordering::Release);
                Err(CclError::sys(&format!("unlinking {}", path.display()), e))
            }
        }
    }

    /// The segment name (`anon` for anonymous mappings).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Usable bytes (offsets `0..len()` are valid for FIFOs and doorbells).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the usable area is empty (never true: `create` rejects 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this handle created the segment (and will unlink it on drop).
    pub fn is_creator(&self) -> bool {
        self.created
    }

    /// Pid written by the creator into the header (0 for a zero header).
    pub fn creator_pid(&self) -> u32 {
        if self.path.is_none() {
            return std::process::id();
        }
        // The creator wrote a u32 pid widened to u64.
        u32::try_from(self.header_u64(PID_OFFSET).load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// A shared `AtomicU64` at `offset` (8-aligned, in bounds). Several handles to the same
    /// word are fine; a word overlapping a live FIFO, a doorbell or a word of another size
    /// is refused (`InvalidUsage`). The claim lasts as long as the region handle.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64> {
        let p = self.claim_ptr(offset, 8, 8, ClaimKind::Atomic { width: 8 })?;
        // SAFETY: claim_ptr checked that [offset, offset+8) lies inside the mapping and is
        // 8-aligned; the mapping lives as long as `self`, which bounds the returned lifetime.
        // The claim (never released while `self` lives, so it outlasts the reference)
        // guarantees no FIFO end hands out a plain slice over these bytes in this process.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// A shared `AtomicU32` at `offset` (4-aligned, in bounds); same rules as
    /// [`ShmRegion::atomic_u64`].
    pub fn atomic_u32(&self, offset: usize) -> Result<&AtomicU32> {
        let p = self.claim_ptr(offset, 4, 4, ClaimKind::Atomic { width: 4 })?;
        // SAFETY: as in atomic_u64, for 4 bytes with 4-byte alignment.
        Ok(unsafe { AtomicU32::from_ptr(p.cast::<u32>()) })
    }

    /// Claims the whole user area for a device (host-staged device FIFOs: kernels and
    /// raw-pointer code access it, so no FIFO end, doorbell or atomic word of this module may
    /// be made over it in this process afterwards) and returns `(mapping start, mapping
    /// length, offset of the user area in the mapping)`. The mapping start is page-aligned
    /// (what `cudaHostRegister` pins); the claim lasts as long as the region handle.
    pub(crate) fn claim_for_device(&self) -> Result<(usize, usize, usize)> {
        self.claim_ptr(0, self.len, CACHE_LINE, ClaimKind::Device)?;
        Ok((self.map.as_mut_ptr() as usize, self.map.len(), HEADER_BYTES))
    }

    /// Header word at `off` (< HEADER_BYTES, 8-aligned); private to this file.
    fn header_u64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= HEADER_BYTES && off.is_multiple_of(8));
        // SAFETY: every mapping is at least HEADER_BYTES long (total_len / the size check in
        // open_attempt) and page-aligned, so base+off is in bounds and 8-aligned; the header
        // is never handed out to users, only accessed atomically here.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(off).cast::<u64>()) }
    }

    /// Checks bounds/alignment of `[offset, offset+len)` in the user area and returns a
    /// pointer to it, without claiming.
    pub(crate) fn user_ptr(&self, offset: usize, len: usize, align: usize) -> Result<*mut u8> {
        let end = offset.checked_add(len).ok_or_else(|| {
            CclError::arg(format!(
                "range {offset}+{len} overflows in segment {}",
                self.name
            ))
        })?;
        if end > self.len {
            return Err(CclError::arg(format!(
                "range {offset}..{end} is outside segment {} of {} bytes",
                self.name, self.len
            )));
        }
        if !offset.is_multiple_of(align) {
            return Err(CclError::arg(format!(
                "offset {offset} in segment {} is not {align}-byte aligned",
                self.name
            )));
        }
        // SAFETY: HEADER_BYTES + end <= HEADER_BYTES + len == mapping length, checked above,
        // so the resulting pointer stays inside the mapping.
        Ok(unsafe { self.map.as_mut_ptr().add(HEADER_BYTES + offset) })
    }

    /// [`ShmRegion::user_ptr`] plus an in-process claim on the range (see [`ClaimKind`]).
    pub(crate) fn claim_ptr(
        &self,
        offset: usize,
        len: usize,
        align: usize,
        kind: ClaimKind,
    ) -> Result<*mut u8> {
        let p = self.user_ptr(offset, len, align)?;
        let range = offset..offset + len; // no overflow: checked by user_ptr
        let mut claims = self.claims.lock();
        if matches!(kind, ClaimKind::Atomic { .. }) {
            if let Some(c) = claims
                .iter_mut()
                .find(|c| c.kind == kind && c.range == range)
            {
                c.refs += 1;
                return Ok(p);
            }
        }
        if let Some(c) = claims
            .iter()
            .find(|c| overlaps(&c.range, &range) && !compatible(c, &range, kind))
        {
            return Err(CclError::usage(format!(
                "bytes {range:?} of segment {} ({kind:?}) overlap {:?} already held as {:?} in this process",
                self.name, c.range, c.kind
            )));
        }
        claims.push(Claim {
            range,
            kind,
            refs: 1,
        });
        Ok(p)
    }

    /// Drops one reference to a claim taken by `claim_ptr`.
    pub(crate) fn release_claim(&self, offset: usize, len: usize, kind: ClaimKind) {
        let range = offset..offset + len;
        let mut claims = self.claims.lock();
        if let Some(i) = claims
            .iter()
            .position(|c| c.range == range && c.kind == kind)
        {
            claims[i].refs -= 1;
            if claims[i].refs == 0 {
                claims.swap_remove(i);
            }
        }
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        if self.created && !self.unlinked.load(Ordering::Acquire) {
            if let Err(e) = self.unlink() {
                tracing::warn!(target: "nccl::SHM", name = %self.name, error = %e, "could not unlink shm segment");
            }
        }
    }
}

/// Mapping length for `len` usable bytes.
fn total_len(len: usize) -> Result<usize> {
    if len == 0 {
        return Err(CclError::arg("shm segment length must be at least 1 byte"));
    }
    len.checked_add(HEADER_BYTES)
        .filter(|t| i64::try_from(*t).is_ok())
        .ok_or_else(|| CclError::arg(format!("shm segment length {len} is too large")))
}

fn total_len_u64(len: u64) -> Option<u64> {
    let l = usize::try_from(len).ok()?;
    total_len(l).ok().map(|t| t as u64)
}

/// Allocates the file's pages now, so that a full `/dev/shm` is an error here instead of a
/// SIGBUS on first touch of a page later (tmpfs allocates lazily). Filesystems without
/// fallocate keep the sparse file.
#[cfg(target_os = "linux")]
fn reserve_pages(file: &std::fs::File, total: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let len =
        libc::off_t::try_from(total).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
    loop {
        // SAFETY: the descriptor is valid for the duration of the call (borrowed `file`);
        // posix_fallocate takes no pointers and returns the error number directly.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        match rc {
            0 => return Ok(()),
            libc::EINTR => continue,
            libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL => return Ok(()),
            e => return Err(std::io::Error::from_raw_os_error(e)),
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn reserve_pages(_file: &std::fs::File, _total: usize) -> std::io::Result<()> {
    Ok(())
}

/// Removes segments `<prefix>-...-<pid>` from `/dev/shm` whose creating process is gone
/// (left by a job that crashed before its peers mapped and unlinked them). Files of other
/// users or with names that do not end in a pid are left alone. Returns how many were
/// removed.
pub fn remove_stale_segments(prefix: &str) -> Result<usize> {
    validate_name(prefix)?;
    let dir = match std::fs::read_dir(SHM_DIR) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(CclError::sys(&format!("listing {SHM_DIR}"), e)),
    };
    let mut removed = 0;
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(pid) = stale_candidate_pid(prefix, name) else {
            continue;
        };
        if pid_alive(pid) {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => {
                tracing::info!(target: "nccl::SHM", name, pid, "removed stale shm segment");
                removed += 1;
            }
            Err(e) => {
                tracing::debug!(target: "nccl::SHM", name, error = %e, "left stale shm segment");
            }
        }
    }
    Ok(removed)
}

/// The creator pid of `name` if it is `<prefix>-<anything>-<pid>` (pure).
pub fn stale_candidate_pid(prefix: &str, name: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let (_, pid) = rest.rsplit_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok().filter(|p| *p > 0)
}

/// Whether `err` is the retryable "segment not found / not ready" error of
/// [`ShmRegion::open`].
pub fn is_not_found(err: &CclError) -> bool {
    matches!(err, CclError::System(m) if m.starts_with(NOT_FOUND_PREFIX))
}

/// `kill(pid, 0)`: false only when the process does not exist (`ESRCH`); a process we may
/// not signal (`EPERM`) is alive. Pid 0 and pids above `i32::MAX` are never alive (they
/// would address process groups).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that `p` exists and may be
    // signalled. No memory is passed.
    let rc = unsafe { libc::kill(p, 0) };
    if rc == 0 {
        return true;
    }
    std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Whether process `pid` is alive for a peer check: it exists ([`pid_alive`]) and is not a
/// zombie (a killed rank whose parent has not reaped it yet is dead for us).
pub fn process_alive(pid: u32) -> bool {
    if !pid_alive(pid) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Format: "pid (comm) S ...": the state follows the last ')'.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next()),
            Some('Z' | 'X')
        ),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_candidates_need_prefix_and_trailing_pid() {
        assert_eq!(stale_candidate_pid("ccl", "ccl-00ab-1-2-345"), Some(345));
        assert_eq!(stale_candidate_pid("ccl", "ccl-x-7"), Some(7));
        assert_eq!(
            stale_candidate_pid("ccl", "ccl-7"),
            None,
            "needs a body before the pid"
        );
        assert_eq!(stale_candidate_pid("ccl", "cclx-a-7"), None);
        assert_eq!(stale_candidate_pid("ccl", "other-a-7"), None);
        assert_eq!(stale_candidate_pid("ccl", "ccl-a-"), None);
        assert_eq!(stale_candidate_pid("ccl", "ccl-a-+7"), None);
        assert_eq!(stale_candidate_pid("ccl", "ccl-a-0"), None);
        assert_eq!(stale_candidate_pid("ccl", "ccl-a-99999999999"), None);
    }

    #[test]
    fn corrupt_header_is_an_error_not_a_retry() {
        let name = format!("ccltest-corrupt-hdr-{}", std::process::id());
        let path = PathBuf::from(SHM_DIR).join(&name);
        let mut bytes = vec![0u8; HEADER_BYTES + 256];
        bytes[MAGIC_OFFSET..MAGIC_OFFSET + 8].copy_from_slice(&MAGIC.to_le_bytes());
        bytes[LEN_OFFSET..LEN_OFFSET + 8].copy_from_slice(&1000u64.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let e = ShmRegion::open(&name).unwrap_err();
        assert!(
            !is_not_found(&e) && e.to_string().contains("corrupt"),
            "{e}"
        );
        assert!(ShmRegion::try_open(&name).is_err());
        // With the right length it opens.
        bytes[LEN_OFFSET..LEN_OFFSET + 8].copy_from_slice(&256u64.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        let r = ShmRegion::open(&name).unwrap();
        assert_eq!(r.len(), 256);
        r.unlink().unwrap();
        assert!(!path.exists());
    }
}
