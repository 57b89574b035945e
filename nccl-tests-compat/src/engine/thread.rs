//! One thread of ranks (`-g` GPUs each): its communicators, the sweep over sizes, types and
//! ops, the timing loop of one size, data initialisation and verification, and the
//! cross-rank reductions of the results.

use super::*;

struct Thread<'a> {
    ctx: &'a Ctx,
    t: usize,
    ranks: Vec<Rank>,
    counts: Counts,
    dtype: DataType,
    bw_sum: f64,
    bw_count: usize,
    errors: u64,
    rep: u64,
    /// Each rank's calls of the operation being started, reused from call to call.
    phases: Vec<Vec<Vec<Call>>>,
}

pub(super) fn thread_main(
    ctx: &Ctx,
    t: usize,
    comms: Option<Vec<Comm>>,
    id: UniqueId,
    base_dev: i32,
) -> (u64, f64) {
    let local = ctx.nthreads * ctx.ngpus;
    let first = ctx.comm_proc * local + t * ctx.ngpus;
    let comms = match comms {
        Some(c) => c,
        None => init_comms(ctx, &id, (first..first + ctx.ngpus).collect(), base_dev, t),
    };
    let a = &ctx.args;
    let buf_len = a.max_bytes as usize + (a.unalign.max(0) as usize) * 8 + 64;
    let mut ranks = Vec::new();
    for (i, comm) in comms.into_iter().enumerate() {
        let dev = base_dev + (t * ctx.ngpus + i) as i32;
        let stream = match &ctx.cuda {
            Some(c) => {
                cuda_try!(ctx, c.set_device(dev));
                if a.stream_null != 0 {
                    0
                } else {
                    cuda_try!(ctx, c.stream_create())
                }
            }
            None => 0,
        };
        let send = cuda_try!(ctx, Buffer::new(&ctx.backend, buf_len));
        let recv = cuda_try!(ctx, Buffer::new(&ctx.backend, buf_len));
        let small = cuda_try!(ctx, Buffer::new(&ctx.backend, 256 * ctx.nranks.max(1)));
        let mut reg = Vec::new();
        if a.local_register != 0 {
            reg.push(nccl_try!(
                ctx,
                ctx.nccl.register(comm, send.addr(), send.len())
            ));
            reg.push(nccl_try!(
                ctx,
                ctx.nccl.register(comm, recv.addr(), recv.len())
            ));
        }
        ranks.push(Rank {
            rank: first + i,
            comm,
            stream,
            send,
            recv,
            small,
            reg,
        });
    }
    let mut th = Thread {
        ctx,
        t,
        ranks,
        counts: Counts {
            send: 0,
            recv: 0,
            param: 0,
            send_inplace: 0,
            recv_inplace: 0,
        },
        dtype: DataType::Float,
        bw_sum: 0.0,
        bw_count: 0,
        errors: 0,
        phases: Vec::new(),
        rep: 0,
    };
    th.device_report();
    th.run_all();

    // Totals for the footer: out-of-bounds checks summed over ranks, mean busbw.
    let oob = th.reduce(th.errors as f64, Reduce::Sum) as u64;
    let avg_bw = if th.bw_count > 0 {
        th.bw_sum / th.bw_count as f64
    } else {
        0.0
    };
    for r in &th.ranks {
        for h in &r.reg {
            nccl_try!(ctx, ctx.nccl.deregister(r.comm, *h));
        }
    }
    {
        let _g = ctx.busy.enter(t);
        for r in th.ranks.drain(..) {
            if let (Some(c), true) = (&ctx.cuda, r.stream != 0) {
                let _ = c.stream_destroy(r.stream);
            }
            nccl_try!(ctx, ctx.nccl.comm_destroy(r.comm));
        }
    }
    (oob, avg_bw)
}

impl Thread<'_> {
    fn is_main(&self) -> bool {
        self.ctx.is_main_proc && self.t == 0
    }

    fn print(&self, s: &str) {
        if self.is_main() {
            print!("{s}");
            let _ = std::io::stdout().flush();
        }
    }

    /// Barrier + reduction over every rank of the communicator: in-process threads, or an
    /// NCCL AllReduce of one double when several processes take part.
    fn reduce(&mut self, v: f64, how: Reduce) -> f64 {
        let ctx = self.ctx;
        let _g = ctx.busy.enter(self.t);
        if ctx.comm_procs == 1 {
            return ctx.tsync.reduce(self.t, v, how);
        }
        let (op, contrib) = match how {
            Reduce::Rank0 => (0, if self.ranks[0].rank == 0 { v } else { 0.0 }),
            Reduce::Avg | Reduce::Sum => (0, v),
            Reduce::Min => (3, v),
            Reduce::Max => (2, v),
        };
        let grouped = self.ranks.len() > 1;
        if grouped {
            nccl_try!(ctx, ctx.nccl.group_start());
        }
        for r in &mut self.ranks {
            let b = if how == Reduce::Rank0 && r.rank != 0 {
                0.0
            } else {
                contrib
            };
            cuda_try!(ctx, r.small.write(0, &b.to_le_bytes()));
            let call = Call {
                kind: CallKind::AllReduce,
                send: r.small.addr(),
                recv: r.small.addr(),
                count: 1,
                dtype: DataType::Double.nccl(),
                op,
                root: -1,
            };
            nccl_try!(ctx, ctx.nccl.run(&call, r.comm, r.stream));
        }
        if grouped {
            nccl_try!(ctx, ctx.nccl.group_end());
        }
        self.complete();
        let bytes = cuda_try!(ctx, self.ranks[0].small.read(0, 8));
        let mut arr = [0u8; 8];
        arr.copy_from_slice(&bytes);
        let x = f64::from_le_bytes(arr);
        if how == Reduce::Avg {
            x / ctx.nranks as f64
        } else {
            x
        }
    }

    fn barrier(&mut self) {
        self.reduce(0.0, Reduce::Sum);
    }

    fn complete(&self) {
        let ctx = self.ctx;
        if let Some(c) = &ctx.cuda {
            let _g = ctx.busy.enter(self.t);
            for r in &self.ranks {
                cuda_try!(ctx, c.stream_sync(r.stream));
            }
        }
    }

    fn device_report(&mut self) {
        let ctx = self.ctx;
        let lines: Vec<String> = if ctx.comm_procs == 1 {
            ctx.device_lines.clone()
        } else {
            // AllGather fixed 256-byte lines over all ranks.
            let _g = ctx.busy.enter(self.t);
            let grouped = self.ranks.len() > 1;
            if grouped {
                nccl_try!(ctx, ctx.nccl.group_start());
            }
            let local0 = ctx.comm_proc * ctx.nthreads * ctx.ngpus;
            for r in &mut self.ranks {
                let line = &ctx.device_lines[r.rank - local0];
                let mut fixed = [0u8; 256];
                let n = line.len().min(255);
                fixed[..n].copy_from_slice(&line.as_bytes()[..n]);
                cuda_try!(ctx, r.small.write(r.rank * 256, &fixed));
                let call = Call {
                    kind: CallKind::AllGather,
                    send: r.small.addr() + r.rank * 256,
                    recv: r.small.addr(),
                    count: 256,
                    dtype: DataType::Uint8.nccl(),
                    op: 0,
                    root: -1,
                };
                nccl_try!(ctx, ctx.nccl.run(&call, r.comm, r.stream));
            }
            if grouped {
                nccl_try!(ctx, ctx.nccl.group_end());
            }
            self.complete();
            let all = cuda_try!(ctx, self.ranks[0].small.read(0, 256 * ctx.nranks));
            all.chunks(256)
                .map(|c| {
                    let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
                    String::from_utf8_lossy(&c[..end]).into_owned()
                })
                .collect()
        };
        if self.is_main() {
            let mut s = String::from("# Using devices\n");
            for l in &lines {
                s += l;
            }
            if ctx.args.memory != 0 {
                let b = ctx.args.max_bytes;
                s += &report::memory_line(&[("Send", b), ("Recv", b)]);
            }
            self.print(&s);
            if let Some(j) = ctx.out.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                j.set_config(&ctx.args, &lines);
            }
        }
    }

    fn run_all(&mut self) {
        let ctx = self.ctx;
        let a = &ctx.args;
        let v = ctx.lib_version;
        let types: Vec<DataType> = match a.dtype {
            Choice::One(t) => vec![t],
            Choice::All => ALL_TYPES
                .iter()
                .copied()
                .filter(|t| match t {
                    DataType::Bfloat16 => v >= 21000,
                    DataType::F8e4m3 | DataType::F8e5m2 => v >= 22400,
                    _ => true,
                })
                .collect(),
        };
        let ops: Vec<Option<RedOp>> = if ctx.coll.reduces() {
            match a.op {
                Choice::One(o) => vec![Some(o)],
                Choice::All => ALL_OPS
                    .iter()
                    .copied()
                    .filter(|o| match o {
                        RedOp::Avg => v >= 21000,
                        RedOp::MulSum => v >= 21100 && ctx.nccl.has("ncclRedOpCreatePreMulSum"),
                        _ => true,
                    })
                    .map(Some)
                    .collect(),
            }
        } else {
            vec![None]
        };
        let roots: Vec<i64> = if ctx.coll.rooted() {
            match a.root {
                Choice::One(r) => vec![r],
                Choice::All => (0..ctx.nranks as i64).collect(),
            }
        } else {
            vec![-1]
        };
        self.print(&report::table_header(a));
        if ctx.coll == Coll::HyperCube && !ctx.nranks.is_power_of_two() {
            self.print(&format!(
                "nRanks {} is not a power of 2, skipping\n",
                ctx.nranks
            ));
            return;
        }
        for &t in &types {
            for &op in &ops {
                for &root in &roots {
                    self.time_test(t, op, root);
                }
            }
        }
    }

    fn setup(&mut self, bytes: u64) {
        let elt = self.dtype.size();
        self.counts = self
            .ctx
            .coll
            .counts(bytes as usize / elt, self.ctx.nranks, elt);
    }

    fn time_test(&mut self, dtype: DataType, op: Option<RedOp>, root: i64) {
        let ctx = self.ctx;
        let a = &ctx.args;
        self.dtype = dtype;
        if let Some(h) = ctx.hang_rank {
            if self.ranks.iter().any(|r| r.rank == h) {
                // Test hook: never join the first collective.
                let _g = ctx.busy.enter(self.t);
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        self.barrier();
        for bytes in [a.max_bytes, a.min_bytes] {
            self.setup(bytes);
            for iter in 0..a.warmup_iters {
                self.start_coll(op, root, false, iter as usize);
            }
            self.complete();
        }
        let sizes = args::sizes(a);
        let mut cycle = 0i64;
        loop {
            for &size in &sizes {
                self.setup(size);
                let elt = dtype.size() as u64;
                let shown = (self.counts.send.max(self.counts.recv) as u64) * elt;
                let op_name = op.map(|o| o.name()).unwrap_or("none");
                let mut line = report::row_prefix(
                    shown,
                    self.counts.param as u64,
                    dtype.name(),
                    op_name,
                    root,
                );
                self.print(&line);
                let (oop, oop_it) = self.bench(op, root, false);
                let mut part = report::row_half(&oop);
                if let Some(s) = &oop_it {
                    part += &report::row_iter_stats(s);
                }
                self.print(&part);
                line += &part;
                let (ip, ip_it) = self.bench(op, root, true);
                let mut part = report::row_half(&ip);
                if let Some(s) = &ip_it {
                    part += &report::row_iter_stats(s);
                }
                if a.report_timestamps != 0 {
                    part += &format!("{:>21}", now_string());
                }
                part.push('\n');
                self.print(&part);
                if self.is_main() {
                    if let Some(j) = ctx.out.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                        let its = oop_it.zip(ip_it);
                        j.add_result(
                            shown,
                            self.counts.param as u64,
                            dtype.name(),
                            op_name,
                            root,
                            a.report_cputime != 0,
                            &oop,
                            &ip,
                            its,
                        );
                    }
                }
            }
            cycle += 1;
            if a.run_cycles != 0 && cycle >= a.run_cycles {
                break;
            }
        }
    }

    /// Launches one operation on every rank of this thread (iteration `iter` picks the
    /// buffer offset).
    fn start_coll(&mut self, op: Option<RedOp>, root: i64, in_place: bool, iter: usize) {
        let ctx = self.ctx;
        let _g = ctx.busy.enter(self.t);
        let a = &ctx.args;
        let elt = self.dtype.size();
        let c = self.counts;
        let total = c.send.max(c.recv) * elt;
        let steps = (a.max_bytes as usize)
            .checked_div(total)
            .unwrap_or(1)
            .max(1);
        let shift = total * (iter % steps) + a.unalign.max(0) as usize * elt;
        let n = ctx.nranks;
        let mut phases = std::mem::take(&mut self.phases);
        phases.resize_with(self.ranks.len(), Vec::new);
        let mut created_ops: Vec<(Comm, i32)> = Vec::new();
        for (r, rank_phases) in self.ranks.iter_mut().zip(&mut phases) {
            let recv = r.recv.addr() + shift;
            let send = r.send.addr() + shift;
            let (s, d) = if in_place {
                (
                    recv + c.send_inplace * elt * r.rank,
                    recv + c.recv_inplace * elt * r.rank,
                )
            } else {
                (send, recv)
            };
            let raw_op = match op {
                Some(RedOp::MulSum) => {
                    let p = GenParams {
                        dtype: self.dtype,
                        op,
                        nranks: n,
                        seed: 0,
                    };
                    let mut scalar = [0u8; 8];
                    self.dtype.encode_int(p.scalar(r.rank), &mut scalar);
                    let o = nccl_try!(
                        ctx,
                        ctx.nccl
                            .create_premulsum(&mut scalar, self.dtype.nccl(), r.comm)
                    );
                    created_ops.push((r.comm, o));
                    o
                }
                Some(o) => o.nccl(),
                None => 0,
            };
            if let Some((src, dst, len)) = ctx.coll.local_copy(s, d, c.param, elt, r.rank) {
                // Hypercube first puts the rank's own block in place (a host-side copy).
                let rb = r.recv.addr();
                if in_place {
                    cuda_try!(ctx, r.recv.copy_within(src - rb, dst - rb, len));
                } else {
                    let data = cuda_try!(ctx, r.send.read(src - r.send.addr(), len));
                    cuda_try!(ctx, r.recv.write(dst - rb, &data));
                }
            }
            ctx.coll.calls_into(
                rank_phases,
                s,
                d,
                c.param,
                self.dtype,
                raw_op,
                root as i32,
                r.rank,
                n,
            );
        }
        let nph = phases.first().map(|p| p.len()).unwrap_or(0);
        #[allow(clippy::needless_range_loop)]
        for k in 0..nph {
            let grouped = self.ranks.len() > 1 || phases[0][k].len() > 1;
            if grouped {
                nccl_try!(ctx, ctx.nccl.group_start());
            }
            for (i, r) in self.ranks.iter().enumerate() {
                for call in &phases[i][k] {
                    nccl_try!(ctx, ctx.nccl.run(call, r.comm, r.stream));
                }
            }
            if grouped {
                nccl_try!(ctx, ctx.nccl.group_end());
            }
        }
        self.phases = phases;
        for (comm, o) in created_ops {
            nccl_try!(ctx, ctx.nccl.destroy_redop(o, comm));
        }
        drop(_g);
        if a.blocking != 0 && a.blocking != 3 {
            self.complete();
            if a.blocking == 1 {
                self.barrier();
            }
        }
    }

    /// Writes fresh inputs for a check (or the timed runs).
    fn init_data(&mut self, op: Option<RedOp>, seed: u64, in_place: bool) {
        let ctx = self.ctx;
        let elt = self.dtype.size();
        let c = self.counts;
        let p = GenParams {
            dtype: self.dtype,
            op,
            nranks: ctx.nranks,
            seed,
        };
        let shift = ctx.args.unalign.max(0) as usize * elt;
        for r in &mut self.ranks {
            let mut data = vec![0u8; c.send * elt];
            p.fill(r.rank, 0, &mut data);
            if in_place {
                cuda_try!(
                    ctx,
                    r.recv.write(shift + c.send_inplace * elt * r.rank, &data)
                );
            } else {
                cuda_try!(ctx, r.send.write(shift, &data));
            }
        }
    }

    fn check_data(&mut self, op: Option<RedOp>, root: i64, seed: u64, in_place: bool) -> u64 {
        let ctx = self.ctx;
        let elt = self.dtype.size();
        let c = self.counts;
        let p = GenParams {
            dtype: self.dtype,
            op,
            nranks: ctx.nranks,
            seed,
        };
        let shift = ctx.args.unalign.max(0) as usize * elt;
        let mut wrong = 0u64;
        for r in &self.ranks {
            let off = shift
                + if in_place {
                    c.recv_inplace * elt * r.rank
                } else {
                    0
                };
            let got = cuda_try!(ctx, r.recv.read(off, c.recv * elt));
            let mut w = 0u64;
            for j in 0..c.recv {
                if let Some(e) = ctx.coll.expected(&p, &c, r.rank, root.max(0) as usize, j) {
                    let g = &got[j * elt..(j + 1) * elt];
                    if !p.matches(e, g) {
                        if w < ctx.debug_wrong {
                            eprintln!(
                                "{}: rank {} {} {} element {j}: expected {e:?}, got {} (inputs {:?})",
                                ctx.host,
                                r.rank,
                                self.dtype.name(),
                                op.map(|o| o.name()).unwrap_or("none"),
                                self.dtype.decode(g),
                                (0..ctx.nranks).map(|q| p.input(q, j)).collect::<Vec<_>>()
                            );
                        }
                        w += 1;
                    }
                }
            }
            if w > 0 {
                self.errors += 1;
            }
            wrong += w;
        }
        wrong
    }

    fn bench(&mut self, op: Option<RedOp>, root: i64, in_place: bool) -> (Half, Option<IterStats>) {
        let ctx = self.ctx;
        let a = &ctx.args;
        if a.check > 0 {
            self.init_data(op, 99, in_place);
        }
        self.start_coll(op, root, in_place, 0);
        self.complete();
        self.barrier();

        let per_iter = a.per_iter_timing != 0;
        let mut iter_times = Vec::new();
        let t0 = Instant::now();
        for iter in 0..a.iters as usize {
            // No clock read per iteration unless it is timed on its own (-G 1).
            let ti = per_iter.then(Instant::now);
            let agg = a.agg_iters as usize;
            if agg > 1 {
                let _g = ctx.busy.enter(self.t);
                nccl_try!(ctx, ctx.nccl.group_start());
            }
            for k in 0..agg {
                self.start_coll(op, root, in_place, iter * agg + k);
            }
            if agg > 1 {
                let _g = ctx.busy.enter(self.t);
                nccl_try!(ctx, ctx.nccl.group_end());
            }
            if per_iter || a.blocking == 3 {
                self.complete();
                if let Some(ti) = ti {
                    iter_times.push(ti.elapsed().as_secs_f64() * 1e6 / agg as f64);
                }
                if a.blocking == 3 {
                    self.barrier();
                }
            }
        }
        let launches = (a.iters * a.agg_iters) as f64;
        let cpu = t0.elapsed().as_secs_f64() / launches;
        self.complete();
        let mut delta = t0.elapsed().as_secs_f64() / launches;
        let how = Reduce::from_average(a.average);
        delta = self.reduce(delta, how);
        let cpu = self.reduce(cpu, how);
        let elt = self.dtype.size();
        let (alg, bus) = ctx
            .coll
            .bandwidth(self.counts.param, elt, delta, ctx.nranks);
        let stats = if per_iter {
            let skip = (a.per_iter_skip.max(0) as usize).min(iter_times.len().saturating_sub(1));
            IterStats::of(&iter_times[skip..]).map(|s| {
                // i_* columns: the maximum over ranks of each statistic.
                let mut s = s;
                s.min = self.reduce(s.min, Reduce::Max);
                s.max = self.reduce(s.max, Reduce::Max);
                s.p99 = self.reduce(s.p99, Reduce::Max);
                s.avg = self.reduce(s.avg, Reduce::Max);
                s.stdev = self.reduce(s.stdev, Reduce::Max);
                s
            })
        } else {
            None
        };
        self.barrier();

        let mut wrong = 0u64;
        let report = a.check > 0 && (!in_place || ctx.coll.reports_in_place_errors());
        let checks = if report { a.check } else { 0 };
        for _ in 0..checks {
            self.rep += 1;
            let seed = self.rep;
            self.init_data(op, seed, in_place);
            self.start_coll(op, root, in_place, 0);
            self.complete();
            let local = self.check_data(op, root, seed, in_place);
            wrong = self.reduce(local as f64, Reduce::Sum) as u64;
            if wrong > 0 {
                break;
            }
        }
        let time_us = if a.report_cputime != 0 { cpu } else { delta } * 1e6;
        self.bw_sum += bus;
        self.bw_count += 1;
        let h = Half {
            time_us,
            algbw: alg,
            busbw: bus,
            wrong: report.then_some(wrong),
        };
        (h, stats)
    }
}
