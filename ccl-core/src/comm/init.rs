//! Communicator creation: init (blocking or not), `ncclCommInitAll`, split, and the
//! agreements every rank makes at init (tuning, backend, analyzer hub).

use super::*;

impl Comm {
    fn new_unready(
        nranks: usize,
        rank: usize,
        device: i32,
        uid: UniqueId,
        cfg: CommConfig,
        device_hint: Option<i32>,
        rank_group: Option<Arc<probe::diag::RankGroup>>,
    ) -> Result<Comm> {
        let tuning = Tuning::from_env(&cfg)?;
        let probe_off = probe::disabled_from_env().map_err(CclError::InvalidArgument)?;
        // The backend is chosen first: a device communicator's frame lives in mapped memory.
        let dev_pre = crate::device::runtime::select(device_hint, tuning.max_channels, rank)?;
        let (frame, device) = match &dev_pre {
            Some(p) => (Arc::clone(&p.frame), p.device),
            None => (Arc::new(Frame::new(tuning.max_channels)), device),
        };
        frame.set_mode(!probe_off);
        let inject = crate::inject::Injection::from_env()?.map(Arc::new);
        // A split child shares its parent's group; an initialised communicator's is chosen
        // at probe registration (`init_rank_group`).
        let rank_group = rank_group.map(OnceLock::from).unwrap_or_default();
        Ok(Comm {
            nranks,
            rank,
            device,
            uid,
            cfg,
            tuning,
            abort_flag: Arc::new(AtomicBool::new(false)),
            life: Mutex::new(Life::Initializing),
            life_cv: Condvar::new(),
            usable_now: AtomicBool::new(false),
            rt: OnceLock::new(),
            init_thread: Mutex::new(None),
            last_error: Mutex::new(None),
            broken: Mutex::new(None),
            frame,
            op_log: Arc::new(OpLog::new()),
            probe_on: !probe_off,
            inject,
            op_counter: Arc::new(AtomicU64::new(0)),
            user_ops: Mutex::new(HashMap::new()),
            next_user_op: AtomicI32::new(FIRST_USER_OP),
            regs: Mutex::new(HashMap::new()),
            next_reg: AtomicUsize::new(1),
            split_seq: AtomicU64::new(0),
            dev_pre: Mutex::new(dev_pre),
            probe_source: OnceLock::new(),
            rank_group,
        })
    }

    /// Second half of init, given a bootstrap: checks the host, connects the transport,
    /// starts the worker.
    fn attach(&self, boot: Bootstrap) -> Result<()> {
        note_algo_proto_env()?;
        // NVIDIA's rule: with both peer-to-peer and shared memory disabled, ranks of one
        // host talk over the network transport.
        let sockets_in_host = crate::env::bool_or(&ccl_params::NCCL_P2P_DISABLE, false)?
            && crate::env::bool_or(&ccl_params::NCCL_SHM_DISABLE, false)?;
        self.check_same_tuning(&boot, sockets_in_host)?;
        self.check_same_backend(&boot)?;
        let pre = self.dev_pre.lock().take();
        if let Some(pre) = pre {
            let me_host = boot.peer_host_hash(self.rank);
            if let Some(r) = (0..self.nranks).find(|&r| boot.peer_host_hash(r) != me_host) {
                return Err(CclError::usage(format!(
                    "the device backend needs all ranks on one host: rank {r} is on {}, rank {} on {}",
                    boot.peer_host(r),
                    self.rank,
                    boot.peer_host(self.rank)
                )));
            }
            return self.attach_device(boot, pre);
        }
        let boot = Arc::new(boot);
        let transport = Transport::connect(
            &boot,
            self.tuning.max_channels,
            self.tuning.p2p_channels(),
            self.tuning.layout(),
            sockets_in_host,
        )?;
        let bell = Doorbell::new(Arc::clone(transport.bell_region()), 0)?;
        let poison = crate::transport::shm::SharedWord::new(
            Arc::clone(transport.bell_region()),
            crate::channel::POISON_OFFSET,
        )?;
        let comm_hash = boot.comm_hash();
        let source = self.register_probe(&boot, comm_hash, -1)?;
        let shared = Shared {
            rank: self.rank,
            nranks: self.nranks,
            comm_id: comm_hash,
            tuning: self.tuning,
            abort: Arc::clone(&self.abort_flag),
            frame: Arc::clone(&self.frame),
            op_log: Arc::clone(&self.op_log),
            probe_on: self.probe_on,
            op_counter: Arc::clone(&self.op_counter),
            inject: self.inject.clone(),
            source,
        };
        let over_sockets = transport.uses_sockets();
        let worker = WorkerHandle::spawn(shared, Arc::clone(&boot), transport)?;
        let rt = Runtime {
            boot,
            comm_hash,
            bell: Some(bell),
            poison: Some(poison),
            worker: Mutex::new(Some(worker)),
            dev: None,
            over_sockets,
        };
        self.rt
            .set(rt)
            .map_err(|_| CclError::Internal("communicator initialised twice".into()))?;
        tracing::info!(target: "nccl::INIT", rank = self.rank,
            "comm {:#018x} rank {} nRanks {} cudaDev {} nChannels {}..{} buffSize {} name {:?} - Init COMPLETE",
            comm_hash, self.rank, self.nranks, self.device, self.tuning.min_channels,
            self.tuning.max_channels, self.tuning.buffsize,
            self.cfg.comm_name.as_deref().unwrap_or(""));
        Ok(())
    }

    /// Starts the process's diagnostic thread if probing is on, agrees on the analyzer hub
    /// with the other ranks (a collective step: every rank calls it) and registers this
    /// rank's frame and op log; `None` when probing is off.
    fn register_probe(
        &self,
        boot: &Bootstrap,
        comm_hash: u64,
        device: i32,
    ) -> Result<Option<Arc<probe::Source>>> {
        let probing = self.probe_on && probe::start().map_err(CclError::InvalidArgument)?;
        self.agree_on_hub(boot, probing)?;
        if !probing {
            return Ok(None);
        }
        let n = self.nranks as u32;
        let r = self.rank as u32;
        let source = probe::register(
            probe::Identity {
                comm_id: comm_hash,
                rank: r,
                nranks: n,
                device,
                ring_prev: (r + n - 1) % n,
                ring_next: (r + 1) % n,
            },
            Arc::clone(&self.frame),
            Arc::clone(&self.op_log),
            Arc::clone(
                self.rank_group
                    .get_or_init(|| self.init_rank_group(boot, device)),
            ),
        );
        let _ = self.probe_source.set(Arc::downgrade(&source));
        Ok(Some(source))
    }

    /// The rank group of a communicator made by `ncclCommInitRank` (or `ncclCommInitAll`):
    /// where it is the process's only rank of the communicator, the process's group of its
    /// device (one process per rank: every communicator of the process on that device is
    /// the same rank's, as PyTorch's process groups are), else a group of its own (ranks as
    /// threads of one process, possibly on one device).
    fn init_rank_group(&self, boot: &Bootstrap, device: i32) -> Arc<probe::diag::RankGroup> {
        let here = |r: usize| (boot.peer_host_hash(r), boot.peer_pid(r));
        let me = here(self.rank);
        let local = (0..self.nranks).filter(|&r| here(r) == me).count();
        if local == 1 {
            probe::diag::RankGroup::of_process_device(device)
        } else {
            probe::diag::RankGroup::new()
        }
    }

    /// Whether this communicator and `other` count as one rank's for the probe's
    /// computation gaps (`probe::diag::RankGroup`): split from one another, or each the
    /// process's only rank of its communicator on the same device. False before either
    /// registered with a running probe.
    pub fn shares_rank_group(&self, other: &Comm) -> bool {
        match (self.rank_group.get(), other.rank_group.get()) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// [`Comm::attach`] for the device backend: probe registration as on the host backend,
    /// then the device FIFOs instead of the shared-memory transport and worker.
    fn attach_device(&self, boot: Bootstrap, pre: DevicePre) -> Result<()> {
        let boot = Arc::new(boot);
        let comm_hash = boot.comm_hash();
        let device = pre.device;
        let source = self.register_probe(&boot, comm_hash, device)?;
        let dev = DeviceComm::attach(AttachArgs {
            pre,
            boot: Arc::clone(&boot),
            tuning: self.tuning,
            abort: Arc::clone(&self.abort_flag),
            op_log: Arc::clone(&self.op_log),
            probe_on: self.probe_on,
            op_counter: Arc::clone(&self.op_counter),
            inject: self.inject.clone(),
            source,
        })?;
        let rt = Runtime {
            boot,
            comm_hash,
            bell: None,
            poison: None,
            worker: Mutex::new(None),
            dev: Some(Arc::new(dev)),
            over_sockets: false,
        };
        self.rt
            .set(rt)
            .map_err(|_| CclError::Internal("communicator initialised twice".into()))?;
        tracing::info!(target: "nccl::INIT", rank = self.rank,
            "comm {:#018x} rank {} nRanks {} cudaDev {} nChannels {}..{} buffSize {} name {:?} backend device - Init COMPLETE",
            comm_hash, self.rank, self.nranks, self.device, self.tuning.min_channels,
            self.tuning.max_channels, self.tuning.buffsize,
            self.cfg.comm_name.as_deref().unwrap_or(""));
        Ok(())
    }

    /// A communicator spanning several processes agrees on the job's embedded analyzer hub
    /// (`probe::hub`): one allgather of what each rank wants and knows, and when nobody
    /// knows a hub yet, a second one in which the elected ranks (the lowest that wants a
    /// hub, normally 0, and the lowest wanting one in another process, the standby)
    /// announce the hubs they started. Both rounds are bounded by the
    /// bootstrap timeout and abort-aware; only a bootstrap failure (or a malformed
    /// `CCLD_*` variable) fails init, a hub that cannot start leaves the processes on their
    /// local engines. A communicator whose ranks all live in this process does nothing.
    fn agree_on_hub(&self, boot: &Bootstrap, probing: bool) -> Result<()> {
        use probe::hub::{self, Contribution, Plan};
        let me = (boot.peer_host_hash(self.rank), boot.peer_pid(self.rank));
        if (0..self.nranks).all(|r| (boot.peer_host_hash(r), boot.peer_pid(r)) == me) {
            return Ok(());
        }
        let wanted = probing && hub::wanted().map_err(CclError::InvalidArgument)?;
        let mine = if wanted {
            Contribution::Wanted(hub::known())
        } else {
            Contribution::NotWanted
        };
        let all: Vec<Contribution> = boot
            .allgather(&mine.encode())?
            .iter()
            .enumerate()
            .map(|(r, b)| {
                // Every rank decodes the same bytes, so every rank reads junk alike.
                Contribution::decode(b).unwrap_or_else(|e| {
                    tracing::debug!(target: "nccl::INIT", rank = self.rank,
                        "CCL-D hub agreement: rank {r} sent {e}; ignoring it");
                    Contribution::NotWanted
                })
            })
            .collect();
        let procs: Vec<(u64, u32)> = (0..self.nranks)
            .map(|r| (boot.peer_host_hash(r), boot.peer_pid(r)))
            .collect();
        match hub::plan(&all, &procs) {
            Plan::Nothing => {}
            Plan::Adopt(hubs) => {
                if wanted {
                    hub::adopt(hubs);
                }
            }
            Plan::Elect { starter, standby } => {
                // The primary's starter and the standby's each start a hub and announce it.
                let announce = if starter == self.rank || standby == Some(self.rank) {
                    let ip = boot.listen_addr().ip();
                    let ip = if ip.is_unspecified() {
                        boot.peer_addr(self.rank).map_or(ip, |a| a.ip())
                    } else {
                        ip
                    };
                    match hub::start(ip) {
                        Ok(a) => a.to_string().into_bytes(),
                        Err(e) => {
                            tracing::warn!(target: "nccl::INIT", rank = self.rank,
                                "CCL-D: {e}; the job's other hub (if any) analyses, else every process locally");
                            Vec::new()
                        }
                    }
                } else {
                    Vec::new()
                };
                let got = boot.allgather(&announce)?;
                let from_standby = standby.and_then(|s| got.get(s)).map(Vec::as_slice);
                match got
                    .get(starter)
                    .and_then(|b| hub::announced(b, from_standby))
                {
                    Some(hubs) if wanted => {
                        hub::adopt(hubs);
                    }
                    Some(_) => {}
                    None => {
                        tracing::debug!(target: "nccl::INIT", rank = self.rank,
                            "CCL-D: no analyzer hub started; local analysis only");
                    }
                }
            }
        }
        Ok(())
    }

    /// Every rank must use the same FIFO layout and channel bounds (schedules and segment
    /// layouts depend on them): compares them over the bootstrap.
    fn check_same_tuning(&self, boot: &Bootstrap, sockets_in_host: bool) -> Result<()> {
        let t = &self.tuning;
        let flag = usize::from(sockets_in_host);
        let mine: Vec<u8> = [t.buffsize, t.min_channels, t.max_channels, flag]
            .iter()
            .flat_map(|v| (*v as u64).to_le_bytes())
            .collect();
        for (r, theirs) in boot.allgather(&mine)?.iter().enumerate() {
            if *theirs != mine {
                let vals: Vec<u64> = theirs
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect();
                return Err(CclError::usage(format!(
                    "rank {r} uses NCCL_BUFFSIZE/min/max channels/sockets within a host {vals:?}, rank {} uses [{}, {}, {}, {flag}]: set the same NCCL_BUFFSIZE, NCCL_MIN_CTAS/NCCL_MAX_CTAS, NCCL_P2P_DISABLE/NCCL_SHM_DISABLE and config on every rank",
                    self.rank, t.buffsize, t.min_channels, t.max_channels
                )));
            }
        }
        Ok(())
    }

    /// Every rank must have chosen the same backend (issue 15, blocker 2): one allgather.
    fn check_same_backend(&self, boot: &Bootstrap) -> Result<()> {
        use crate::device::agree::{check_agreement, BackendCode};
        let code = match &*self.dev_pre.lock() {
            None => BackendCode::Host,
            Some(p) if p.api.is_emulated() => BackendCode::Emulated,
            Some(_) => BackendCode::Cuda,
        };
        check_agreement(&boot.allgather(&[code as u8])?, self.rank)
    }

    fn finish_init(self: &Arc<Self>, r: Result<()>) -> Result<()> {
        match r {
            Ok(()) => {
                {
                    let mut reg = registry().lock();
                    reg.retain(|w| w.strong_count() > 0);
                    reg.push(Arc::downgrade(self));
                }
                let mut g = self.life.lock();
                if matches!(*g, Life::Initializing) {
                    *g = Life::Ready;
                    let broken = self.broken.lock();
                    self.usable_now.store(broken.is_none(), Ordering::Release);
                }
                self.life_cv.notify_all();
                Ok(())
            }
            Err(e) => {
                tracing::warn!(target: "nccl::INIT", rank = self.rank, "init failed: {e}");
                self.record_error(&e);
                self.set_life(Life::Failed(e.clone()));
                Err(e)
            }
        }
    }

    fn init_with(self: &Arc<Self>, blocking: bool) -> Result<()> {
        let run = |c: &Comm| -> Result<()> {
            let timeout = bootstrap::default_timeout()?;
            let boot =
                Bootstrap::init(&c.uid, c.nranks, c.rank, Arc::clone(&c.abort_flag), timeout)?;
            c.attach(boot)
        };
        if blocking {
            let r = run(self);
            self.finish_init(r)
        } else {
            let me = Arc::clone(self);
            let h = std::thread::Builder::new()
                .name(format!("ccl-init-r{}", self.rank))
                .spawn(move || {
                    let r = run(&me);
                    let _ = me.finish_init(r);
                })
                .map_err(|e| CclError::sys("spawning the init thread", e))?;
            *self.init_thread.lock() = Some(h);
            Ok(())
        }
    }

    /// `ncclCommInitRank(Config)`. With `cfg.blocking == Some(false)` it returns at once a
    /// communicator whose [`Comm::async_error`] is `Err(InProgress)` until init finishes.
    pub fn init_rank(nranks: i32, id: UniqueId, rank: i32, cfg: CommConfig) -> Result<Arc<Comm>> {
        Self::init_rank_dev(nranks, id, rank, cfg, 0, None)
    }

    /// `ncclCommInitRank(Config)` called inside a group (see [`crate::group::init_rank`]):
    /// the backend and device are chosen now, on the calling thread (NCCL programs call
    /// `cudaSetDevice` before each grouped init), and the rest of init (bootstrap, FIFOs)
    /// runs on an init thread, so one thread can create several ranks of one communicator.
    /// Returns the communicator and whether the caller asked for a blocking one (the
    /// outermost `ncclGroupEnd` then waits for it with [`Comm::wait_init_result`]).
    pub(crate) fn init_rank_in_group(
        nranks: i32,
        id: UniqueId,
        rank: i32,
        cfg: CommConfig,
    ) -> Result<(Arc<Comm>, bool)> {
        let blocking = blocking(&cfg)?;
        let comm = Self::init_rank_inner(nranks, id, rank, cfg, 0, None, false)?;
        Ok((comm, blocking))
    }

    /// Waits until init finished (successfully or not) and returns its outcome.
    pub(crate) fn wait_init_result(&self) -> Result<()> {
        self.wait_init();
        match &*self.life.lock() {
            Life::Failed(e) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    fn init_rank_dev(
        nranks: i32,
        id: UniqueId,
        rank: i32,
        cfg: CommConfig,
        device: i32,
        device_hint: Option<i32>,
    ) -> Result<Arc<Comm>> {
        let blocking = blocking(&cfg)?;
        Self::init_rank_inner(nranks, id, rank, cfg, device, device_hint, blocking)
    }

    fn init_rank_inner(
        nranks: i32,
        id: UniqueId,
        rank: i32,
        cfg: CommConfig,
        device: i32,
        device_hint: Option<i32>,
        blocking: bool,
    ) -> Result<Arc<Comm>> {
        if nranks < 1 {
            return Err(CclError::arg(format!("nranks {nranks} must be at least 1")));
        }
        if rank < 0 || rank >= nranks {
            return Err(CclError::arg(format!(
                "rank {rank} is out of range for nranks {nranks}"
            )));
        }
        let comm = Arc::new(Comm::new_unready(
            nranks as usize,
            rank as usize,
            device,
            id,
            cfg,
            device_hint,
            None,
        )?);
        comm.init_with(blocking)?;
        Ok(comm)
    }

    /// `ncclCommInitAll`: `ndev` ranks as threads of this process, rank i on `devlist[i]`
    /// (or device i).
    pub fn init_all(ndev: i32, devlist: Option<Vec<i32>>) -> Result<Vec<Arc<Comm>>> {
        if ndev < 1 {
            return Err(CclError::arg(format!("ndev {ndev} must be at least 1")));
        }
        if let Some(d) = &devlist {
            if d.len() < ndev as usize {
                return Err(CclError::arg(format!(
                    "devlist has {} entries for ndev {ndev}",
                    d.len()
                )));
            }
            if let Some(bad) = d.iter().take(ndev as usize).find(|v| **v < 0) {
                return Err(CclError::arg(format!("invalid device {bad} in devlist")));
            }
        }
        let id = bootstrap::get_unique_id()?;
        let handles: Vec<_> = (0..ndev)
            .map(|r| {
                let dev = devlist.as_ref().map_or(r, |d| d[r as usize]);
                std::thread::Builder::new()
                    .name(format!("ccl-initall-r{r}"))
                    .spawn(move || {
                        let cfg = CommConfig {
                            blocking: Some(true),
                            ..CommConfig::default()
                        };
                        Comm::init_rank_dev(ndev, id, r, cfg, dev, Some(dev))
                    })
                    .map_err(|e| CclError::sys("spawning an init thread", e))
            })
            .collect();
        let mut comms = Vec::with_capacity(ndev as usize);
        let mut first_err = None;
        for h in handles {
            let r = match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(CclError::Internal("init thread panicked".into()))),
                Err(e) => Err(e),
            };
            match r {
                Ok(c) => comms.push(c),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            None => Ok(comms),
            Some(e) => {
                for c in &comms {
                    let _ = c.abort();
                }
                Err(e)
            }
        }
    }

    /// `ncclCommSplit`; `Ok(None)` for `NCCL_SPLIT_NOCOLOR`.
    pub fn split(
        self: &Arc<Self>,
        color: i32,
        key: i32,
        cfg: CommConfig,
    ) -> Result<Option<Arc<Comm>>> {
        if color < SPLIT_NOCOLOR {
            return Err(CclError::arg(format!(
                "split color {color} must be >= 0 or NCCL_SPLIT_NOCOLOR (-1)"
            )));
        }
        let rt = self.ready_runtime()?;
        let mut mine = Vec::with_capacity(8);
        mine.extend_from_slice(&color.to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = rt.boot.allgather(&mine)?;
        let seq = self.split_seq.fetch_add(1, Ordering::AcqRel);
        if color == SPLIT_NOCOLOR {
            return Ok(None);
        }
        let mut members: Vec<(i32, usize)> = Vec::new();
        for (r, b) in all.iter().enumerate() {
            let (c, k) = match b.as_slice() {
                [c0, c1, c2, c3, k0, k1, k2, k3] => (
                    i32::from_le_bytes([*c0, *c1, *c2, *c3]),
                    i32::from_le_bytes([*k0, *k1, *k2, *k3]),
                ),
                _ => {
                    return Err(CclError::Remote(format!(
                        "split: rank {r} sent {} bytes of (color, key)",
                        b.len()
                    )))
                }
            };
            if c == color {
                members.push((k, r));
            }
        }
        members.sort_unstable();
        let members: Vec<usize> = members.into_iter().map(|(_, r)| r).collect();
        let new_rank = members
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| CclError::Internal("split: this rank is not a member".into()))?;
        let lineage = mix64(mix64(seq) ^ u64::from(color as u32));
        let child_boot = rt.boot.split(&members, lineage)?;
        let cfg = cfg.or(&self.cfg);
        let child = Arc::new(Comm::new_unready(
            members.len(),
            new_rank,
            self.device,
            self.uid,
            cfg,
            Some(self.device),
            self.rank_group.get().cloned(),
        )?);
        let r = child.attach(child_boot);
        child.finish_init(r)?;
        tracing::info!(target: "nccl::INIT", rank = self.rank,
            "comm {:#018x} split color {color} key {key} -> rank {new_rank} of {}",
            rt.comm_hash, members.len());
        Ok(Some(child))
    }
}
