//! Connecting a device communicator: how a peer's kernel reaches this rank's inbound FIFOs
//! (raw addresses, CUDA IPC, staging segments), the FIFO descriptor exchanged over the
//! bootstrap, and `attach`.

use super::*;

/// Descriptor kinds on the wire.
pub(super) const DESC_RAW: u8 = 0;
pub(super) const DESC_IPC: u8 = 1;
pub(super) const DESC_STAGED: u8 = 2;

/// How a receiver's inbound FIFOs from one peer are made reachable by the peer's kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerPath {
    /// The peer is in this process: raw device addresses.
    SameProcess,
    /// Another process: CUDA IPC handles of the receiver's device memory.
    Ipc,
    /// Another process: a shared-memory segment both processes map and pin for their
    /// device (`host_register`); each kernel uses its own device alias.
    HostStaged,
}

impl std::fmt::Display for PeerPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PeerPath::SameProcess => "raw device addresses (same process)",
            PeerPath::Ipc => "CUDA IPC",
            PeerPath::HostStaged => "host-staged shm",
        })
    }
}

/// The path for a peer (pure): same process -> raw addresses; another process -> CUDA IPC
/// when the API has it and `NCCL_P2P_DISABLE` is not set, else host staging.
pub fn choose_path(same_process: bool, ipc_available: bool, p2p_disabled: bool) -> PeerPath {
    if same_process {
        PeerPath::SameProcess
    } else if ipc_available && !p2p_disabled {
        PeerPath::Ipc
    } else {
        PeerPath::HostStaged
    }
}

/// The address a kernel on `device` uses for a user buffer at `p` described by `info`
/// (pure): device memory of that device, managed memory, or pinned host memory through its
/// device address (as NCCL, any device-accessible pointer). Anything else is the reason in
/// words: unregistered host memory, or device memory of another device (the kernel would
/// fault).
pub fn kernel_address(info: PtrInfo, p: usize, device: i32) -> std::result::Result<usize, String> {
    match info.kind {
        PtrKind::Device if info.device == device => Ok(if info.device_ptr != 0 {
            info.device_ptr
        } else {
            p
        }),
        PtrKind::Device => Err(format!(
            "is memory of CUDA device {}, but this communicator runs on device {device}",
            info.device
        )),
        PtrKind::Managed => Ok(p),
        PtrKind::HostPinned if info.device_ptr != 0 => Ok(info.device_ptr),
        PtrKind::HostPinned => Err(format!(
            "is pinned host memory not mapped for device {device} (register it with \
             cudaHostRegisterMapped or allocate it with cudaHostAllocMapped)"
        )),
        PtrKind::Host => Err(format!(
            "is host memory, but this communicator runs on CUDA device {device} (pass device \
             or pinned buffers, or use {ENV_BACKEND}=host)"
        )),
    }
}

/// Link code in staging segment names.
pub(super) fn link_code(link: LinkKind) -> u64 {
    match link {
        LinkKind::Ring => 1,
        LinkKind::P2p => 2,
    }
}

/// Name of the staging segment holding `receiver`'s inbound FIFOs of `link` from `peer`,
/// created by process `pid` (pure).
pub(super) fn staging_name(
    comm: u64,
    receiver: usize,
    peer: usize,
    link: LinkKind,
    pid: u32,
) -> String {
    segment_name_for_pid(
        STAGING_PREFIX,
        comm,
        &[receiver as u64, peer as u64, link_code(link)],
        pid,
    )
}

/// Removes staging segments of dead processes, once per process (before its first one).
pub(crate) fn sweep_stale_staging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| match remove_stale_segments(STAGING_PREFIX) {
        Ok(0) => {}
        Ok(n) => tracing::info!(target: "nccl::SHM",
            "removed {n} stale host-staged FIFO segment(s) of dead processes"),
        Err(e) => tracing::debug!(target: "nccl::SHM", "sweeping stale staging segments: {e}"),
    });
}

/// A shared-memory segment of host-staged FIFOs, mapped in this process and registered
/// for the device. Dropping it unregisters, then unmaps (and, for the creator, unlinks the
/// name if the peer never did).
#[derive(Debug)]
pub(super) struct Staged {
    pub(super) api: Arc<dyn DeviceApi>,
    pub(super) region: ShmRegion,
    /// Start of the mapping (the registered range) and its device alias.
    pub(super) host: usize,
    pub(super) dev: usize,
    /// Offset of the region's user area from `host`.
    pub(super) user: usize,
}

impl Staged {
    /// Claims `region`'s user area for the device and registers the whole mapping.
    pub(super) fn map(api: &Arc<dyn DeviceApi>, region: ShmRegion) -> Result<Staged> {
        let (host, len, user) = region.claim_for_device()?;
        let dev = api.host_register(host, len)?;
        Ok(Staged {
            api: Arc::clone(api),
            region,
            host,
            dev,
            user,
        })
    }

    /// Device address of user-area offset `off`.
    pub(super) fn dev_addr(&self, off: usize) -> usize {
        self.dev + self.user + off
    }

    /// Host address of user-area offset `off`.
    pub(super) fn host_addr(&self, off: usize) -> usize {
        self.host + self.user + off
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Err(e) = self.api.host_unregister(self.host) {
            tracing::warn!(target: "nccl::ALLOC", segment = %self.region.name(),
                "unregistering a host-staged FIFO segment: {e}");
        }
    }
}

/// One rank's inbound FIFOs for a peer (channels 0..n), as the peer's kernel reaches them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum FifoEnds {
    /// Raw device addresses (same process).
    Raw(Vec<usize>),
    /// CUDA IPC handles, one per FIFO allocation.
    Ipc(Vec<IpcHandle>),
    /// A staging segment and the FIFOs' offsets in its user area.
    Staged { name: String, offsets: Vec<usize> },
}

impl FifoEnds {
    pub(super) fn len(&self) -> usize {
        match self {
            FifoEnds::Raw(v) => v.len(),
            FifoEnds::Ipc(v) => v.len(),
            FifoEnds::Staged { offsets, .. } => offsets.len(),
        }
    }
}

/// A FIFO descriptor: the receiver's pid and its ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FifoDesc {
    pub(super) pid: u32,
    pub(super) ends: FifoEnds,
}

/// Wire form: pid (u32 LE), kind (u8: 0 raw, 1 IPC, 2 staged), n (u32 LE), then kind 0:
/// n addresses (u64 LE); kind 1: n handles of 64 bytes; kind 2: name length (u16 LE), the
/// name (ASCII), n offsets (u64 LE).
pub(super) fn encode_desc(d: &FifoDesc) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + d.ends.len() * CCL_IPC_HANDLE_BYTES + 256);
    v.extend_from_slice(&d.pid.to_le_bytes());
    let (kind, n) = match &d.ends {
        FifoEnds::Raw(a) => (DESC_RAW, a.len()),
        FifoEnds::Ipc(h) => (DESC_IPC, h.len()),
        FifoEnds::Staged { offsets, .. } => (DESC_STAGED, offsets.len()),
    };
    v.push(kind);
    v.extend_from_slice(&(n as u32).to_le_bytes());
    match &d.ends {
        FifoEnds::Raw(a) => a
            .iter()
            .for_each(|a| v.extend_from_slice(&(*a as u64).to_le_bytes())),
        FifoEnds::Ipc(h) => h.iter().for_each(|h| v.extend_from_slice(h)),
        FifoEnds::Staged { name, offsets } => {
            // Names are at most MAX_NAME_LEN (240) bytes: validate_name, checked by the
            // creator (ShmRegion::create) and by decode.
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(name.as_bytes());
            offsets
                .iter()
                .for_each(|o| v.extend_from_slice(&(*o as u64).to_le_bytes()));
        }
    }
    v
}

/// Parses a descriptor from `peer`; junk (unknown kind, truncated or trailing bytes, a bad
/// segment name, unaligned offsets) is a `Remote` error naming the problem.
pub(super) fn decode_desc(b: &[u8], peer: usize) -> Result<FifoDesc> {
    let bad = |why: String| {
        CclError::Remote(format!(
            "rank {peer} sent a malformed device FIFO descriptor: {why}"
        ))
    };
    let mut pos = 0usize;
    let mut take = |n: usize, what: &str| -> Result<&[u8]> {
        let end = pos
            .checked_add(n)
            .filter(|e| *e <= b.len())
            .ok_or_else(|| bad(format!("truncated ({} bytes) in {what}", b.len())))?;
        let r = &b[pos..end];
        pos = end;
        Ok(r)
    };
    let u32_at = |x: &[u8]| u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
    let u64_at = |x: &[u8]| {
        let mut a = [0u8; 8];
        a.copy_from_slice(x);
        u64::from_le_bytes(a)
    };
    let pid = u32_at(take(4, "pid")?);
    let kind = take(1, "kind")?[0];
    let n = u32_at(take(4, "count")?) as usize;
    let ends = match kind {
        DESC_RAW => {
            let body = take(n.saturating_mul(8), "addresses")?;
            FifoEnds::Raw(body.chunks_exact(8).map(|c| u64_at(c) as usize).collect())
        }
        DESC_IPC => {
            let body = take(n.saturating_mul(CCL_IPC_HANDLE_BYTES), "IPC handles")?;
            FifoEnds::Ipc(
                body.chunks_exact(CCL_IPC_HANDLE_BYTES)
                    .map(|c| {
                        let mut h = [0u8; CCL_IPC_HANDLE_BYTES];
                        h.copy_from_slice(c);
                        h
                    })
                    .collect(),
            )
        }
        DESC_STAGED => {
            let l = take(2, "name length")?;
            let len = usize::from(u16::from_le_bytes([l[0], l[1]]));
            let raw = take(len, "segment name")?;
            let name = std::str::from_utf8(raw)
                .map_err(|_| bad("segment name is not UTF-8".into()))?
                .to_string();
            validate_name(&name).map_err(|e| bad(e.to_string()))?;
            if !name.starts_with(&format!("{STAGING_PREFIX}-")) {
                return Err(bad(format!(
                    "segment name {name:?} is not a staging segment ({STAGING_PREFIX}-...)"
                )));
            }
            let body = take(n.saturating_mul(8), "offsets")?;
            let offsets: Vec<usize> = body.chunks_exact(8).map(|c| u64_at(c) as usize).collect();
            if let Some(o) = offsets.iter().find(|o| *o % CACHE_LINE != 0) {
                return Err(bad(format!(
                    "FIFO offset {o} is not {CACHE_LINE}-byte aligned"
                )));
            }
            FifoEnds::Staged { name, offsets }
        }
        k => return Err(bad(format!("unknown kind {k}"))),
    };
    if pos != b.len() {
        return Err(bad(format!("{} trailing bytes", b.len() - pos)));
    }
    Ok(FifoDesc { pid, ends })
}

/// Waits for a bootstrap message without a deadline, ending on abort (like the host
/// transport's p2p handshake).
pub(super) fn recv_patiently(
    boot: &Bootstrap,
    peer: usize,
    tag: u32,
    abort: &AtomicBool,
) -> Result<Vec<u8>> {
    loop {
        if abort.load(Ordering::Acquire) {
            return Err(CclError::Aborted(format!(
                "ncclCommAbort called while waiting for rank {peer} to connect"
            )));
        }
        match boot.recv_timeout(peer, tag, Duration::from_millis(100)) {
            Err(CclError::Timeout(_)) => {}
            other => return other,
        }
    }
}

impl DeviceComm {
    /// Second half of a device communicator's init: connects the ring FIFOs over the
    /// bootstrap (every rank calls it).
    pub(crate) fn attach(a: AttachArgs) -> Result<DeviceComm> {
        let boot = a.boot;
        let nranks = boot.nranks();
        let rank = boot.rank();
        let p2p_disabled = crate::env::bool_or(ENV_P2P_DISABLE, false)?;
        let plan_mem = crate::device::plans::from_env()?;
        let (setup, order) = {
            let _dev = DeviceGuard::new(&*a.pre.api, a.pre.device)?;
            let setup = a.pre.api.stream_create()?;
            match Order::new(Arc::clone(&a.pre.api)) {
                Ok(o) => (setup, o),
                Err(e) => {
                    let _ = a.pre.api.stream_destroy(setup);
                    return Err(e);
                }
            }
        };
        let pids: Vec<u32> = (0..nranks).map(|r| boot.peer_pid(r)).collect();
        let hosts: Vec<String> = (0..nranks).map(|r| boot.peer_host(r).to_string()).collect();
        let board = match Board::setup(&boot, boot.comm_hash()) {
            Ok(b) => b.map(Arc::new),
            Err(e) => {
                let _ = order.destroy();
                let _ = a.pre.api.stream_destroy(setup);
                return Err(e);
            }
        };
        let watch = Watch::start(WatchCfg {
            api: Arc::clone(&a.pre.api),
            device: a.pre.device,
            event: order.event(),
            peers: local_peers(rank, &pids, &hosts),
            kernel_abort: a.pre.abort.host,
            board: board.clone(),
            period: a.tuning.peer_check,
            rank,
            comm_id: boot.comm_hash(),
        });
        let watch = match watch {
            Ok(w) => w,
            Err(e) => {
                let _ = order.destroy();
                let _ = a.pre.api.stream_destroy(setup);
                return Err(e);
            }
        };
        let wh = watch.handle();
        let completions = match Completions::start(
            format!("ccl-dev-done-r{rank}"),
            Box::new(move || wh.error().map(|e| e.to_string())),
        ) {
            Ok(c) => c,
            Err(e) => {
                watch.stop();
                let _ = order.destroy();
                let _ = a.pre.api.stream_destroy(setup);
                return Err(e);
            }
        };
        // CUDA's hardware queues (the emulator has none to share).
        let seat =
            (!a.pre.api.is_emulated()).then(|| crate::device::queues::register(a.pre.device, rank));
        let dc = DeviceComm {
            api: a.pre.api,
            device: a.pre.device,
            rank,
            nranks,
            comm_id: boot.comm_hash(),
            tuning: a.tuning,
            p2p_disabled,
            pids,
            boot,
            frame: a.pre.frame,
            frame_dev: a.pre.frame_dev,
            abort_mem: a.pre.abort,
            abort: a.abort,
            op_log: a.op_log,
            probe_on: a.probe_on,
            op_counter: a.op_counter,
            inject: a.inject,
            diverged: AtomicBool::new(false),
            source: a.source,
            state: Mutex::new(State::default()),
            inflight: Arc::new(Inflight::default()),
            spare: Arc::new(Mutex::new(Vec::new())),
            setup,
            seqs: Mutex::new(crate::desc::SeqState::default()),
            board,
            proto: a.pre.proto,
            order,
            watch,
            completions,
            starts: Arc::new(Starts::default()),
            plan_mem,
            _seat: seat,
        };
        if nranks > 1 {
            let prev = (rank + nranks - 1) % nranks;
            let next = (rank + 1) % nranks;
            let n = dc.tuning.max_channels;
            let connected = dc
                .send_inbound(LinkKind::Ring, prev, n, TAG_RING)
                .and_then(|()| dc.recv_outbound(LinkKind::Ring, next, n, TAG_RING));
            if let Err(e) = connected {
                // Nothing is enqueued yet: release the FIFOs, mappings, flag and stream.
                dc.shutdown();
                return Err(e);
            }
        }
        tracing::info!(target: "nccl::INIT", rank = rank,
            "comm {:#018x}: device FIFOs of the ring connected ({} channels, {} x {} B)",
            dc.comm_id, dc.tuning.max_channels, dc.tuning.nslots, dc.tuning.slot_bytes);
        Ok(dc)
    }

    pub(super) fn conn_bytes(&self) -> usize {
        descs_off(&self.tuning) + self.tuning.nslots * CCL_DESC_WORDS * 8
    }

    /// Makes our inbound FIFOs from `peer` (channels 0..n of `link`) by the path
    /// [`choose_path`] picks and sends their descriptor to `peer`.
    pub(super) fn send_inbound(
        &self,
        link: LinkKind,
        peer: usize,
        n: usize,
        tag: u32,
    ) -> Result<()> {
        let _dev = DeviceGuard::new(&*self.api, self.device)?;
        let me = std::process::id();
        let path = choose_path(
            self.pids[peer] == me,
            self.api.supports_ipc(),
            self.p2p_disabled,
        );
        let ends = match path {
            PeerPath::HostStaged => self.staged_inbound(link, peer, n)?,
            PeerPath::SameProcess | PeerPath::Ipc => {
                let ends = self.device_inbound(link, peer, n, path)?;
                // The counters must be zero before the peer (or our kernel) can see them.
                self.api.stream_synchronize(self.setup)?;
                ends
            }
        };
        match link {
            LinkKind::Ring => tracing::info!(target: "nccl::INIT", rank = self.rank,
                "comm {:#018x}: ring FIFOs from rank {peer} ({n} channels) via {path}",
                self.comm_id),
            LinkKind::P2p => tracing::info!(target: "nccl::P2P", rank = self.rank,
                "comm {:#018x}: p2p FIFOs from rank {peer} ({n} channels) via {path}",
                self.comm_id),
        }
        self.boot
            .send(peer, tag, &encode_desc(&FifoDesc { pid: me, ends }))
    }

    /// Inbound FIFOs in device memory (raw addresses or IPC handles for the peer); the
    /// counters are zeroed on the setup stream (the caller synchronizes it).
    pub(super) fn device_inbound(
        &self,
        link: LinkKind,
        peer: usize,
        n: usize,
        path: PeerPath,
    ) -> Result<FifoEnds> {
        let mut raw = Vec::with_capacity(n);
        let mut ipc = Vec::with_capacity(n);
        let mut st = self.state.lock();
        for ch in 0..n {
            let base = self.api.malloc(self.conn_bytes())?;
            st.owned.push(base);
            // SAFETY: fresh allocation of conn_bytes() >= SLOTS_OFF bytes; ZEROS is static.
            unsafe {
                self.api
                    .memcpy_async(base, ZEROS.as_ptr() as usize, SLOTS_OFF, self.setup)?
            };
            st.conns.insert(
                ConnKey {
                    link,
                    peer,
                    channel: ch,
                    dir: ConnDir::In,
                },
                ConnMem { base },
            );
            if path == PeerPath::Ipc {
                ipc.push(self.api.ipc_get(base)?);
            } else {
                raw.push(base);
            }
        }
        Ok(if path == PeerPath::Ipc {
            FifoEnds::Ipc(ipc)
        } else {
            FifoEnds::Raw(raw)
        })
    }

    /// Bytes between consecutive FIFOs of a staging segment.
    pub(super) fn staged_stride(&self) -> Result<usize> {
        align_up(self.conn_bytes(), CACHE_LINE)
            .ok_or_else(|| CclError::arg("NCCL_BUFFSIZE too large: FIFO size overflows"))
    }

    /// Inbound FIFOs in a new staging segment (created, zeroed, registered here).
    pub(super) fn staged_inbound(&self, link: LinkKind, peer: usize, n: usize) -> Result<FifoEnds> {
        sweep_stale_staging();
        let stride = self.staged_stride()?;
        let bytes = stride
            .checked_mul(n)
            .ok_or_else(|| CclError::arg("NCCL_BUFFSIZE x channels overflows"))?
            .max(CACHE_LINE);
        let name = staging_name(self.comm_id, self.rank, peer, link, std::process::id());
        let seg = Staged::map(&self.api, ShmRegion::create(&name, bytes)?)?;
        let offsets: Vec<usize> = (0..n).map(|ch| ch * stride).collect();
        let mut st = self.state.lock();
        for (ch, &off) in offsets.iter().enumerate() {
            // SAFETY: off + SLOTS_OFF <= off + stride <= bytes: inside the user area, which
            // `Staged::map` claimed for the device; no kernel or peer has its address yet.
            // (A new segment is zero already; zeroing the counters states the invariant.)
            unsafe { std::ptr::write_bytes(seg.host_addr(off) as *mut u8, 0, SLOTS_OFF) };
            st.conns.insert(
                ConnKey {
                    link,
                    peer,
                    channel: ch,
                    dir: ConnDir::In,
                },
                ConnMem {
                    base: seg.dev_addr(off),
                },
            );
        }
        st.staged.push(seg);
        Ok(FifoEnds::Staged { name, offsets })
    }

    /// Receives `peer`'s inbound FIFO descriptors (its FIFOs from us): our outbound ends.
    pub(super) fn recv_outbound(
        &self,
        link: LinkKind,
        peer: usize,
        n: usize,
        tag: u32,
    ) -> Result<()> {
        let b = recv_patiently(&self.boot, peer, tag, &self.abort)?;
        let d = decode_desc(&b, peer)?;
        // IPC mappings are opened in the current device's context: this rank's.
        let _dev = DeviceGuard::new(&*self.api, self.device)?;
        if d.ends.len() != n {
            return Err(CclError::Remote(format!(
                "rank {peer} offered {} FIFO channels, expected {n} (different NCCL_MAX_CTAS?)",
                d.ends.len()
            )));
        }
        let bases: Vec<usize> = match d.ends {
            FifoEnds::Raw(addrs) => {
                if d.pid != std::process::id() {
                    return Err(CclError::Remote(format!(
                        "rank {peer} (pid {}) sent a raw device address to another process",
                        d.pid
                    )));
                }
                if let Some(&a) = addrs.first() {
                    self.reach_same_process_peer(peer, a)?;
                }
                addrs
            }
            FifoEnds::Ipc(handles) => {
                let mut v = Vec::with_capacity(n);
                for h in &handles {
                    let p = self.api.ipc_open(h)?;
                    self.state.lock().opened.push(p);
                    v.push(p);
                }
                v
            }
            FifoEnds::Staged { name, offsets } => {
                self.staged_outbound(link, peer, d.pid, &name, &offsets)?
            }
        };
        let mut st = self.state.lock();
        for (ch, base) in bases.into_iter().enumerate() {
            st.conns.insert(
                ConnKey {
                    link,
                    peer,
                    channel: ch,
                    dir: ConnDir::Out,
                },
                ConnMem { base },
            );
        }
        Ok(())
    }

    /// Lets our kernels write into the FIFO memory at `addr` of `peer`, a rank of this
    /// process: when it lives on another device, peer access from our device to that one
    /// is enabled (the caller made our device current), or refused clearly when the two
    /// devices cannot reach each other.
    pub(super) fn reach_same_process_peer(&self, peer: usize, addr: usize) -> Result<()> {
        let info = self.api.pointer_info(addr)?;
        if info.kind != PtrKind::Device || info.device < 0 || info.device == self.device {
            return Ok(());
        }
        if !self.api.can_access_peer(self.device, info.device)? {
            return Err(CclError::usage(format!(
                "rank {peer}'s FIFOs are on device {}, which kernels on device {} cannot reach \
                 (no peer-to-peer access between them): run those ranks in separate processes \
                 with {ENV_P2P_DISABLE}=1",
                info.device, self.device
            )));
        }
        self.api.enable_peer_access(info.device)?;
        tracing::info!(target: "nccl::P2P", rank = self.rank,
            "comm {:#018x}: peer access device {} -> {} enabled (rank {peer})",
            self.comm_id, self.device, info.device);
        Ok(())
    }

    /// Maps and registers `peer`'s staging segment `name` (created by process `pid`),
    /// checks it, unlinks its name (we are its only other user) and returns our device
    /// addresses of its FIFOs.
    pub(super) fn staged_outbound(
        &self,
        link: LinkKind,
        peer: usize,
        pid: u32,
        name: &str,
        offsets: &[usize],
    ) -> Result<Vec<usize>> {
        let want = staging_name(self.comm_id, peer, self.rank, link, pid);
        if name != want {
            return Err(CclError::Remote(format!(
                "rank {peer} named staging segment {name:?}, expected {want:?}"
            )));
        }
        // The receiver created the segment before it sent the descriptor.
        let region = ShmRegion::open(name)?;
        if region.creator_pid() != pid {
            return Err(CclError::Remote(format!(
                "staging segment {name} was created by pid {}, not by rank {peer} (pid {pid})",
                region.creator_pid()
            )));
        }
        let fifo = self.conn_bytes();
        if let Some(o) = offsets
            .iter()
            .find(|o| o.checked_add(fifo).is_none_or(|e| e > region.len()))
        {
            return Err(CclError::Remote(format!(
                "rank {peer}: FIFO at offset {o} ({fifo} bytes) lies outside staging segment \
                 {name} of {} bytes (different NCCL_BUFFSIZE?)",
                region.len()
            )));
        }
        let seg = Staged::map(&self.api, region)?;
        if let Err(e) = seg.region.unlink() {
            // The receiver's handle unlinks it at destroy.
            tracing::warn!(target: "nccl::SHM", rank = self.rank, "{e}");
        }
        let bases = offsets.iter().map(|&o| seg.dev_addr(o)).collect();
        self.state.lock().staged.push(seg);
        Ok(bases)
    }

    /// Phase 1 of lazy p2p connections: sends our inbound FIFO descriptors to every peer
    /// of `peers` not connected yet. Every such peer must do the same for us at the same
    /// point of its program (its matching operation).
    pub(crate) fn p2p_begin(&self, peers: &[usize]) -> Result<()> {
        let mut new: Vec<usize> = {
            let st = self.state.lock();
            peers
                .iter()
                .copied()
                .filter(|p| {
                    *p != self.rank && !st.p2p_peers.contains(p) && !st.p2p_pending.contains(p)
                })
                .collect()
        };
        new.sort_unstable();
        new.dedup();
        for &p in &new {
            self.send_inbound(LinkKind::P2p, p, self.tuning.p2p_channels(), TAG_P2P)?;
            self.state.lock().p2p_pending.push(p);
        }
        Ok(())
    }

    /// Phase 2: receives the descriptors of the peers of [`Self::p2p_begin`].
    pub(crate) fn p2p_finish(&self) -> Result<()> {
        let pending = std::mem::take(&mut self.state.lock().p2p_pending);
        for p in pending {
            self.recv_outbound(LinkKind::P2p, p, self.tuning.p2p_channels(), TAG_P2P)?;
            self.state.lock().p2p_peers.insert(p);
            tracing::debug!(target: "nccl::P2P", rank = self.rank,
                "comm {:#018x}: device p2p FIFOs with rank {p} connected", self.comm_id);
        }
        Ok(())
    }

    /// The p2p peers `item` needs (AlltoAll/Gather/Scatter and Send/Recv groups).
    pub(crate) fn p2p_peers_of(&self, item: &WorkItem) -> Result<Vec<usize>> {
        // Zero-count calls included: they exchange a descriptor-only message when checking.
        let plan = self.plan_of(item, &self.tuning, crate::desc::check_on())?;
        Ok(plan
            .lanes
            .iter()
            .filter(|l| l.link == LinkKind::P2p && !l.steps.is_empty())
            .flat_map(|l| l.recv_from.into_iter().chain(l.send_to))
            .collect())
    }
}
