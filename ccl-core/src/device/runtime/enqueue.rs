//! Running operations: the memory pool (spare device and mapped blocks), uploading a
//! lowered plan, and `enqueue` (launch, completion, probe records).

use super::*;
use crate::schedule::Plan;

impl DeviceComm {
    /// A spare device block of at least `bytes` (the smallest that fits), else a new one.
    pub(super) fn take_device(&self, bytes: usize) -> Result<(usize, usize)> {
        {
            let mut sp = self.spare.lock();
            let best = sp
                .iter()
                .enumerate()
                .filter_map(|(i, f)| match f {
                    Freed::Device { bytes: b, .. } if *b >= bytes => Some((i, *b)),
                    _ => None,
                })
                .min_by_key(|(_, b)| *b);
            if let Some((i, _)) = best {
                if let Freed::Device { ptr, bytes } = sp.swap_remove(i) {
                    return Ok((ptr, bytes));
                }
            }
        }
        Ok((self.api.malloc(bytes)?, bytes))
    }

    /// A spare mapped block of at least `bytes` (the smallest that fits), else a new one.
    pub(super) fn take_mapped(&self, bytes: usize) -> Result<(Mapped, usize)> {
        {
            let mut sp = self.spare.lock();
            let best = sp
                .iter()
                .enumerate()
                .filter_map(|(i, f)| match f {
                    Freed::Mapped { bytes: b, .. } if *b >= bytes => Some((i, *b)),
                    _ => None,
                })
                .min_by_key(|(_, b)| *b);
            if let Some((i, _)) = best {
                if let Freed::Mapped { m, bytes } = sp.swap_remove(i) {
                    return Ok((m, bytes));
                }
            }
        }
        Ok((self.api.host_alloc_mapped(bytes)?, bytes))
    }

    /// Frees the spare blocks (destroy, after every operation completed).
    pub(super) fn free_spares(&self) -> Vec<Result<()>> {
        let v = std::mem::take(&mut *self.spare.lock());
        v.into_iter()
            .map(|f| match f {
                Freed::Device { ptr, .. } => self.api.free(ptr),
                Freed::Mapped { m, .. } => self.api.host_free(m.host),
            })
            .collect()
    }

    /// Checks that a user buffer is device memory (CUDA; the emulator takes any pointer).
    /// The address this communicator's kernels use for the user buffer `p` (see
    /// [`kernel_address`]); a buffer they cannot reach is `ncclInvalidArgument`. The
    /// emulator takes any pointer (its device addresses are host addresses).
    pub(super) fn kernel_buffer(&self, what: &str, label: &str, p: usize) -> Result<usize> {
        if p == 0 || self.api.is_emulated() {
            return Ok(p);
        }
        let info = self.api.pointer_info(p)?;
        kernel_address(info, p, self.device)
            .map_err(|why| CclError::arg(format!("{label}: {what} {p:#x} {why}")))
    }

    pub(super) fn reducer(&self, spec: &RedSpec, dtype: DataType) -> Result<(Reducer, usize)> {
        let n = self.nranks;
        Ok(match spec {
            RedSpec::Builtin(k) => (Reducer::new(dtype, *k, None, n)?, 0),
            RedSpec::PreMul(ScalarArg::HostImmediate(v)) => {
                (Reducer::new(dtype, RedOpKind::PreMulSum, Some(v), n)?, 0)
            }
            RedSpec::PreMul(ScalarArg::Device(addr)) => {
                // The kernel reads the scalar from device memory when it runs.
                let zero = [0u8; 8];
                (
                    Reducer::new(dtype, RedOpKind::PreMulSum, Some(&zero[..dtype.size()]), n)?,
                    *addr,
                )
            }
        })
    }

    pub(super) fn upload(
        &self,
        st: &mut State,
        lp: &LoweredPlan,
        conns: &[ccl_dev_conn_t],
        proto: Proto,
        stream: Stream,
    ) -> Result<(u64, Uploaded, bool)> {
        // Connections that need an LL scrub make a one-off array (rare: the first LL
        // operation after Simple ones); the cache holds arrays without scrubs only.
        let cacheable = conns.iter().all(|c| c.ll_sync == 0);
        let mut h = DefaultHasher::new();
        (proto, lp.n_channels, lp.unit, &lp.conns).hash(&mut h);
        for s in &lp.steps {
            (s.kind, s.src_buf, s.dst_buf, s.src_off, s.dst_off, s.count).hash(&mut h);
        }
        for l in &lp.lanes {
            (
                l.channel,
                l.first_step,
                l.n_steps,
                l.conn_in,
                l.conn_out,
                l.flags,
            )
                .hash(&mut h);
        }
        for l in &lp.locals {
            (l.kind, l.src_buf, l.dst_buf, l.src_off, l.dst_off, l.count).hash(&mut h);
        }
        let key = h.finish();
        if let (true, Some(v)) = (cacheable, st.cache.get(&key)) {
            if let Some((_, u)) = v.iter().find(|(p, _)| p == lp) {
                return Ok((key, *u, true));
            }
        }
        let align = |x: usize| x.div_ceil(64) * 64;
        let steps = 0;
        let lanes = align(steps + lp.steps.len() * std::mem::size_of::<ccl_dev_step_t>());
        let locals = align(lanes + lp.lanes.len() * std::mem::size_of::<ccl_dev_lane_t>());
        let cn = align(locals + lp.locals.len() * std::mem::size_of::<ccl_dev_local_t>());
        let total = cn + std::mem::size_of_val(conns);
        let (m, bytes) = self.take_mapped(total.max(64))?;
        // SAFETY: `m.host` is fresh mapped memory of `total` bytes, at least 64-byte aligned
        // (cudaHostAlloc: page; emulator: 256), so every typed destination is aligned and
        // in bounds; the sources are live vectors of those lengths.
        unsafe {
            std::ptr::copy_nonoverlapping(
                lp.steps.as_ptr(),
                (m.host + steps) as *mut ccl_dev_step_t,
                lp.steps.len(),
            );
            std::ptr::copy_nonoverlapping(
                lp.lanes.as_ptr(),
                (m.host + lanes) as *mut ccl_dev_lane_t,
                lp.lanes.len(),
            );
            std::ptr::copy_nonoverlapping(
                lp.locals.as_ptr(),
                (m.host + locals) as *mut ccl_dev_local_t,
                lp.locals.len(),
            );
            std::ptr::copy_nonoverlapping(
                conns.as_ptr(),
                (m.host + cn) as *mut ccl_dev_conn_t,
                conns.len(),
            );
        }
        let (ddev, dbytes) = match self.plan_mem {
            PlanMem::Mapped => (0, 0),
            PlanMem::Device => {
                let copied = self.take_device(total.max(64)).and_then(|(d, b)| {
                    // SAFETY: `d` has at least `total` bytes; the mapped source lives until
                    // the operation completed (cached: until destroy; else handed back by
                    // the completion function), after this copy ran on `stream`.
                    match unsafe { self.api.memcpy_async(d, m.host, total, stream) } {
                        Ok(()) => Ok((d, b)),
                        Err(e) => {
                            self.spare.lock().push(Freed::Device { ptr: d, bytes: b });
                            Err(e)
                        }
                    }
                });
                match copied {
                    Ok(v) => v,
                    Err(e) => {
                        self.spare.lock().push(Freed::Mapped { m, bytes });
                        return Err(e);
                    }
                }
            }
        };
        let u = Uploaded {
            host: m.host,
            dev: m.dev,
            ddev,
            dbytes,
            steps,
            lanes,
            locals,
            conns: cn,
            bytes,
        };
        if cacheable && st.cached < PLAN_CACHE {
            st.cached += 1;
            st.cache.entry(key).or_default().push((lp.clone(), u));
            return Ok((key, u, true));
        }
        Ok((key, u, false))
    }

    /// The protocol `item` runs with on this communicator (`NCCL_PROTO`, the operation's
    /// size; the same on every rank).
    pub(crate) fn protocol_of(&self, item: &WorkItem) -> Proto {
        let shape = match item {
            WorkItem::Coll(c) => {
                let per_rank_in = matches!(
                    c.kind,
                    CollKind::ReduceScatter | CollKind::AlltoAll | CollKind::Scatter
                );
                let bytes = c.count.saturating_mul(c.dtype.size());
                OpShape::Coll {
                    bytes: if per_rank_in {
                        bytes.saturating_mul(self.nranks)
                    } else {
                        bytes
                    },
                }
            }
            WorkItem::P2p(_) => OpShape::P2pGroup,
        };
        self.proto.choose(shape)
    }

    /// The tuning an operation of protocol `p` is planned with: LL messages carry at most
    /// `ll_chunk_bytes(slot_bytes)` payload bytes (the FIFOs themselves are the same).
    pub(crate) fn plan_tuning(&self, p: Proto) -> Tuning {
        match p {
            Proto::Simple => self.tuning,
            Proto::Ll => Tuning {
                slot_bytes: proto::ll_chunk_bytes(self.tuning.slot_bytes),
                ..self.tuning
            },
        }
    }

    /// The plan `item` runs with `tuning`. With the descriptor check on, a zero-count
    /// operation still carries its descriptor, as on the host backend: one
    /// descriptor-only message on each link it would use (a receiver of an LL message
    /// without lines finds it by the tail, which a checking kernel reads).
    pub(crate) fn plan_of(&self, item: &WorkItem, tuning: &Tuning, checking: bool) -> Result<Plan> {
        let mut plan = crate::op::plan_for(item, self.rank, self.nranks, tuning)?;
        if checking {
            crate::desc::add_descriptor_only_steps(&mut plan, item, self.rank, self.nranks);
        }
        Ok(plan)
    }

    /// Enqueues one work item on `stream` (0 = default stream) and returns.
    pub(crate) fn enqueue(&self, item: &WorkItem, stream: Stream) -> Result<()> {
        if self.state.lock().closed {
            return Err(CclError::usage("communicator was destroyed"));
        }
        // Completions that are due run first: a failure they find is this call's error.
        self.completions.poll();
        // A kernel fault or a dead peer broke the communicator (blocker 8).
        if let Some(e) = self.watch.error() {
            return Err(e);
        }
        let _dev = DeviceGuard::new(&*self.api, self.device)?;
        let stream = if stream == 0 {
            self.api.default_stream(self.device)?
        } else {
            stream
        };
        // Graph capture would replay one-shot host callbacks: refused before anything is
        // enqueued (issue 15 blocker 3).
        if self.api.stream_capturing(stream)? {
            return Err(crate::device::capture::refusal(&item.label(), stream));
        }
        // After the previous operation of this communicator, whatever its stream.
        self.order.join(stream)?;
        let mut frees: Vec<Freed> = Vec::new();
        let r = self.enqueue_inner(item, stream, &mut frees);
        if r.is_err() && !frees.is_empty() {
            // Nothing was enqueued that uses them (or the completion function owns them).
            self.spare.lock().extend(frees);
        }
        let marked = self.order.mark(stream);
        match r.and(marked) {
            // An earlier kernel on this stream faulted (CUDA's errors of that kind are
            // sticky) before the watch saw it: the same error as the watch reports, so that
            // this call, `ncclCommGetAsyncError` and later calls agree.
            Err(e) => match self.api.stream_query(stream) {
                Err(fault) => Err(self.watch.kernel_faulted(&fault.to_string())),
                Ok(_) => Err(e),
            },
            Ok(()) => Ok(()),
        }
    }

    /// The error that broke the communicator on the device (a kernel fault, a dead
    /// peer), for `ncclCommGetAsyncError`.
    pub(crate) fn async_error(&self) -> Option<CclError> {
        // What completed on the device counts at once, not when the thread looks next.
        self.completions.poll();
        self.watch.error()
    }

    /// The kernel's plan of `lp`: its arrays uploaded (or found in the cache), the
    /// connections' FIFOs, buffers, reduction and injected faults filled in; the check
    /// and the probe frame are left off (the caller sets them). Memory to hand back at
    /// completion goes to `frees`.
    #[allow(clippy::too_many_arguments)]
    fn kernel_plan(
        &self,
        label: &str,
        lp: &LoweredPlan,
        proto: Proto,
        stream: Stream,
        bufs: &[usize],
        faults: &FaultFields,
        rp: Option<RedParams>,
        scalar_dev: usize,
        frees: &mut Vec<Freed>,
    ) -> Result<ccl_dev_plan_t> {
        let mut st = self.state.lock();
        let mut conns: Vec<ccl_dev_conn_t> = lp
            .conns
            .iter()
            .map(|k| {
                st.conns.get(k).map(|c| c.abi(&self.tuning)).ok_or_else(|| {
                    CclError::Internal(format!("{label}: device connection {k:?} is not set up"))
                })
            })
            .collect::<Result<_>>()?;
        // Every connection of the plan carries messages (lowering gives a lane a
        // connection only when it has steps that use it).
        for (c, k) in conns.iter_mut().zip(&lp.conns) {
            c.ll_sync = st.ll.entry(*k).or_default().use_for(proto);
        }
        let (_, up, cached) = self.upload(&mut st, lp, &conns, proto, stream)?;
        drop(st);
        if !cached {
            frees.push(Freed::Mapped {
                m: Mapped {
                    host: up.host,
                    dev: up.dev,
                },
                bytes: up.bytes,
            });
            if up.ddev != 0 {
                frees.push(Freed::Device {
                    ptr: up.ddev,
                    bytes: up.dbytes,
                });
            }
        }
        // Where the kernel reads the arrays (blocker 9, `plans`).
        let base = if up.ddev != 0 { up.ddev } else { up.dev };
        let mut p = ccl_dev_plan_t {
            n_channels: lp.n_channels,
            n_lanes: lp.lanes.len() as u32,
            n_locals: lp.locals.len() as u32,
            n_steps: lp.steps.len() as u32,
            n_conns: conns.len() as u32,
            unit: lp.unit,
            steps: (base + up.steps) as *const _,
            lanes: (base + up.lanes) as *const _,
            locals: (base + up.locals) as *const _,
            conns: (base + up.conns) as *const _,
            proto: proto.abi(),
            abort_flag: self.abort_mem.dev as *const u32,
            throttle_gap_ns: faults.throttle_gap_ns,
            stall_channel: faults.stall_channel,
            stall_after: faults.stall_after,
            rank: self.rank as u32,
            ..ccl_dev_plan_t::idle()
        };
        for (d, b) in p.bufs.iter_mut().zip(bufs) {
            *d = *b as *mut _;
        }
        if let Some(rp) = rp {
            p.reduce = 1;
            p.dtype = rp.dtype;
            p.op = rp.op;
            p.avg_divisor = rp.avg_divisor;
            p.scalar_bits = rp.scalar_bits;
            if scalar_dev != 0 {
                p.scalar_dev = scalar_dev as *const _;
            }
        }
        Ok(p)
    }

    pub(super) fn enqueue_inner(
        &self,
        item: &WorkItem,
        stream: Stream,
        frees: &mut Vec<Freed>,
    ) -> Result<()> {
        let label = item.label();
        let proto = self.protocol_of(item);
        // Decided once per operation (the benchmark may switch it between operations).
        let checking = crate::desc::check_on();
        let plan = self.plan_of(item, &self.plan_tuning(proto), checking)?;
        // CCLD_INJECT: the faults of the operation this call becomes (its counter is taken
        // below; calls on one communicator are serialized, as NCCL requires), applied with
        // the host executor's rules (see `inject`).
        let mut fault = match &self.inject {
            Some(inj) => inj.for_op(
                self.rank,
                self.nranks,
                self.op_counter.load(Ordering::Acquire),
            ),
            None => crate::inject::OpFault::default(),
        };
        if self.diverged.load(Ordering::Acquire) {
            fault.not_enter = true;
        }
        // h2: the rank runs the first half of every lane (its op type set says half the
        // count); the expected counts stay the schedule's.
        let run_plan = if fault.halve && !fault.not_enter {
            halved(&plan)
        } else {
            plan.clone()
        };
        let (mut bufs, red, dtype_bytes): (Vec<usize>, Option<(Reducer, usize)>, usize) = match item
        {
            WorkItem::Coll(c) => {
                let send = self.kernel_buffer("sendbuff", &label, c.sendbuf)?;
                let recv = self.kernel_buffer("recvbuff", &label, c.recvbuf)?;
                let red = match &c.red {
                    Some(spec) => Some(self.reducer(spec, c.dtype)?),
                    None => None,
                };
                (vec![send, recv], red, c.count * c.dtype.size())
            }
            WorkItem::P2p(calls) => (
                calls
                    .iter()
                    .map(|c| self.kernel_buffer("buff", &c.label(), c.buf))
                    .collect::<Result<Vec<usize>>>()?,
                None,
                0,
            ),
        };
        if let WorkItem::Coll(c) = item {
            let total = dtype_bytes * self.nranks;
            if c.kind == CollKind::AlltoAll
                && total > 0
                && c.sendbuf < c.recvbuf + total
                && c.recvbuf < c.sendbuf + total
            {
                // In-place AlltoAll: stage the input (ordered on the stream).
                let (scratch, bytes) = self.take_device(total)?;
                frees.push(Freed::Device {
                    ptr: scratch,
                    bytes,
                });
                // SAFETY: scratch has `total` bytes; sendbuf is valid for `total` bytes
                // until the operation completed (enqueue contract); ordered on `stream`.
                unsafe { self.api.memcpy_async(scratch, bufs[0], total, stream)? };
                bufs[0] = scratch;
            }
        }
        if bufs.len() > CCL_MAX_BUFS {
            return Err(CclError::usage(format!(
                "the device backend runs at most {CCL_MAX_BUFS} buffers per operation"
            )));
        }
        let mut lp = lower(&run_plan, bufs.len())?;
        let faults = apply_fault(&mut lp, &fault);
        let rp = match &red {
            Some((r, _)) => Some(red_params(r, self.nranks)?),
            None => None,
        };
        let scalar_dev = red.as_ref().map_or(0, |(_, d)| *d);
        // A plan that only moves bytes (one rank) runs as copies on the stream instead of
        // the kernel's local steps (NVIDIA's NCCL copies too), from COPY_MIN_BYTES on.
        let copies = byte_copies(&lp, &bufs, rp.as_ref())
            .filter(|c| c.is_empty() || c.iter().map(|x| x.bytes).sum::<usize>() >= COPY_MIN_BYTES);
        let mut work = match copies {
            Some(copies) => Work::Copies(copies),
            None => Work::Kernel(Box::new(self.kernel_plan(
                &label, &lp, proto, stream, &bufs, &faults, rp, scalar_dev, frees,
            )?)),
        };
        // The descriptors of the kernels' check (by buffer index, as on the host backend)
        // and the operation's sequence-space identity for the probe: taken for every
        // operation that is enqueued, launched or copied, and for no other.
        let (descs, seq_id) = self.seqs.lock().descriptors(item);
        let checking = checking && matches!(work, Work::Kernel(_));
        let counter = self.op_counter.fetch_add(1, Ordering::AcqRel);
        let block = (counter % probe::FRAME_BLOCKS as u64) as usize;
        // Probing can be paused at run time (`Comm::set_probing`): decided once per operation.
        let probing = self.probe_on && self.frame.is_measuring();
        if let Work::Kernel(p) = &mut work {
            if checking {
                p.check = (self.abort_mem.dev + CHECK_OFF) as *mut u64;
                for (w, d) in p.desc.iter_mut().zip(&descs) {
                    *w = *d;
                }
            }
            if probing {
                p.frame = self.frame_dev as *mut u64;
                p.frame_capacity = self.frame.channel_capacity() as u32;
                p.frame_block = block as u32;
            }
            // Opened by this operation's start, below (ccl_device.h, start_gate); also the
            // value the blocks store into their completion words.
            p.start_gate = gate_value(counter);
            p.done = (self.abort_mem.dev + DONE_OFF) as *mut u32;
        }
        let mut info = crate::op::type_set(item, self.nranks, &plan);
        info.proto = match proto {
            Proto::Simple => ccl_optype::Proto::Simple,
            Proto::Ll => ccl_optype::Proto::Ll,
        };
        if fault.halve && !fault.not_enter {
            info.count /= 2;
            info.bytes /= 2;
            tracing::warn!(target: "nccl::COLL", rank = self.rank,
                "CCLD_INJECT: operation {counter} runs half its steps; no further operation is \
                 issued on this communicator");
            self.diverged.store(true, Ordering::Release);
        }
        if fault.throttle.is_some() || fault.stall.is_some() {
            tracing::warn!(target: "nccl::COLL", rank = self.rank,
                "CCLD_INJECT: operation {counter}: throttle {:?}, stall {:?}",
                fault.throttle, fault.stall);
        }
        let expected: Vec<(usize, u64, u64)> = plan
            .lanes
            .iter()
            .map(|l| {
                let (s, r) = l.step_counts();
                (l.channel, s, r)
            })
            .collect();
        crate::op::log_call(
            item,
            &info,
            self.rank,
            self.nranks,
            self.comm_id,
            counter,
            Some(stream),
        );
        // The operation's start time and whether its end is read from the clock, from its
        // probe start to its completion (both run on host threads of their own).
        let timing: Arc<std::sync::OnceLock<(u64, bool)>> = Arc::default();
        // The operation's start in the probe (blocker 10: off the kernel's critical path,
        // see `starts`).
        let start = {
            let timing = Arc::clone(&timing);
            let frame = Arc::clone(&self.frame);
            let op_log = Arc::clone(&self.op_log);
            let source = self.source.clone();
            let (comm_id, n_ch) = (self.comm_id, plan.n_channels);
            let gate = self.abort_mem.host + GATE_OFF;
            move || {
                if probing {
                    // As the operation starts (not at enqueue: the heartbeats' latest
                    // operation must not run ahead of it): its records and the heartbeats
                    // number it in its sequence space (collective / p2p); whether its end
                    // is read from the clock goes to its completion (`timing`).
                    let t = probe::now_ns();
                    let timed = source
                        .as_ref()
                        .is_none_or(|src| src.start_op(counter, &seq_id, t));
                    let _ = timing.set((t, timed));
                    let b = frame.begin_op(comm_id, counter, n_ch);
                    for (ch, s, r) in expected {
                        frame.add_expected(b, ch, s, r);
                    }
                    op_log.start(counter, &info, t);
                }
                // The frame block is ready: the kernel may write it (its start gate).
                // SAFETY: the gate word lies in the abort memory, mapped host memory that
                // lives until shutdown, which waits for every operation (and so for every
                // start) first; 4-byte aligned; the kernels only read it.
                unsafe { AtomicU32::from_ptr(gate as *mut u32) }
                    .store(gate_value(counter), Ordering::Release);
            }
        };
        self.inflight.add();
        self.watch.begin();
        if fault.not_enter || fault.delay.is_some() {
            // CCLD_INJECT: a host function before the kernel holds it back, and the
            // operation must not look started before it let go.
            let abort = Arc::clone(&self.abort);
            let rank = self.rank;
            let before = move || {
                if fault.not_enter {
                    tracing::warn!(target: "nccl::COLL", rank = rank,
                        "CCLD_INJECT: not entering operation {counter} (blocked until abort)");
                    while !abort.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                if let Some(d) = fault.delay {
                    std::thread::sleep(d);
                }
                start();
            };
            if let Err(e) = self.api.launch_host_fn(stream, Box::new(before)) {
                self.inflight.done();
                self.watch.handle().end();
                return Err(e);
            }
            if let Some(noop) = self.starts.submit(Box::new(|| {})) {
                noop();
            }
        } else if let Some(now) = self.starts.submit(Box::new(start)) {
            now();
        }
        let after = {
            let timing = Arc::clone(&timing);
            let op_log = Arc::clone(&self.op_log);
            let source = self.source.clone();
            let inflight = Arc::clone(&self.inflight);
            let spare = Arc::clone(&self.spare);
            let frees = std::mem::take(frees);
            let abort = Arc::clone(&self.abort);
            let watch = self.watch.handle();
            let starts = Arc::clone(&self.starts);
            // The check area, and what names a record's peer (only while checking).
            let check = checking.then(|| CheckArea {
                host: self.abort_mem.host + CHECK_OFF,
                conns: lp.conns.clone(),
                rank: self.rank,
                comm_id: self.comm_id,
                board: self.board.clone(),
            });
            // Host state only (it may run on a thread without a device).
            move |fault: Option<String>| {
                if let Some(detail) = fault {
                    watch.fail(
                        crate::device::liveness::kernel_fault(&detail),
                        probe::Failure::cause(probe::FailureCause::Internal),
                    );
                }
                if let Some(c) = &check {
                    if let Some((e, f)) = c.failure() {
                        // Once: later completions of the failed communicator find the
                        // same record.
                        if watch.fail(e.clone(), f) {
                            tracing::warn!(target: "nccl::COLL", rank = c.rank, "{e}");
                        }
                    }
                }
                if probing {
                    let failure = watch.failure();
                    let ok = !abort.load(Ordering::Acquire) && failure.is_none();
                    let end = match (&source, timing.get()) {
                        (Some(s), Some(&(t, timed))) => s.end_time(counter, t, timed, ok),
                        _ => probe::EndTime::exact(probe::now_ns()),
                    };
                    let fin = op_log.finish(counter, end, ok);
                    match (&source, fin, failure) {
                        (Some(s), Some(fin), None) => s.op_done(&fin),
                        (Some(s), Some(fin), Some(f)) => {
                            s.op_failed(&fin, f);
                            probe::diag::flush(FAILURE_FLUSH);
                        }
                        _ => {}
                    }
                }
                spare.lock().extend(frees);
                // The next operation's start, if it is already enqueued (`starts`).
                if let Some(next) = starts.complete() {
                    next();
                }
                watch.end();
                inflight.done();
            }
        };
        let value = gate_value(counter);
        let launched = match &work {
            // SAFETY: the arrays live in mapped memory handed back for reuse only by the
            // completion and freed at shutdown after all operations); the
            // FIFOs, frame, abort memory and completion words live until shutdown; user
            // buffers are valid until completion (the enqueue contract).
            Work::Kernel(p) => unsafe { self.api.launch_plan(p, stream) },
            Work::Copies(copies) => copies
                .iter()
                // SAFETY: each copy lies inside the operation's user buffers (`byte_copies`
                // derives it from the plan's local steps over them), which stay valid
                // until the operation completed (the enqueue contract); ordered on
                // `stream`.
                .try_for_each(|c| unsafe { self.api.memcpy_async(c.dst, c.src, c.bytes, stream) })
                // Then an empty plan whose one block stores the completion word.
                .and_then(|()| {
                    let p = ccl_dev_plan_t {
                        abort_flag: self.abort_mem.dev as *const u32,
                        done: (self.abort_mem.dev + DONE_OFF) as *mut u32,
                        start_gate: value,
                        // (No lanes: the protocol changes nothing; the operation's one.)
                        proto: proto.abi(),
                        ..ccl_dev_plan_t::idle()
                    };
                    // SAFETY: the plan has no arrays; the abort memory and completion
                    // words live until shutdown.
                    unsafe { self.api.launch_plan(&p, stream) }
                }),
        };
        // The completion runs even when the launch failed (it releases memory and the
        // in-flight count): at once (in order) then, since no block will store its words.
        let n = match (&work, &launched) {
            (_, Err(_)) => 0,
            (Work::Kernel(p), Ok(())) => p.n_channels,
            (Work::Copies(_), Ok(())) => 1,
        };
        let signal = Signal {
            words: self.abort_mem.host + DONE_OFF,
            n,
            value,
        };
        self.completions.push(signal, Box::new(after));
        launched.map_err(|e| crate::error::with_context(e, &label))
    }
}

/// Bytes from which a one-rank operation that only moves bytes runs as `cudaMemcpyAsync`
/// (then an empty plan for its completion word) rather than as the kernel's local steps.
/// On an H200 (docs/gpu-results.md, run 2) an 8-byte AllReduce took 8.3 us per operation
/// through the kernel and 12.6 us as a copy and the empty plan, while at 128 MiB the
/// kernel's 4 blocks moved 20 GB/s and the copy engine 1,900-2,000. Not measured between
/// the two: 64 KiB keeps the kernel's share to a few microseconds.
const COPY_MIN_BYTES: usize = 64 << 10;

/// What an operation enqueues on its stream.
enum Work {
    /// The plan kernel.
    Kernel(Box<ccl_dev_plan_t>),
    /// Byte copies (a plan that only moves bytes, see `byte_copies`).
    Copies(Vec<ByteCopy>),
}

/// The start gate's value of operation `counter` (`ccl_dev_plan_t.start_gate`; wraps).
fn gate_value(counter: u64) -> u32 {
    (counter as u32).wrapping_add(1)
}
