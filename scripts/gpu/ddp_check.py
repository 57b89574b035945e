#!/usr/bin/env python3
"""PyTorch DDP check for the GPU suite: 2 processes share cuda:0 (backend "nccl", our
libnccl.so.2 through LD_PRELOAD), train a small model for a few steps on their halves of
each batch; the parameters must match a single-process run on the concatenated batches
within float tolerance. Usage: LD_PRELOAD=/path/to/our/libnccl.so.2 ddp_check.py <out.json>
(spawns its own 2 workers; exit 0 pass, 1 fail, 2 not runnable here).

It also checks that OUR library did the work: every worker must have the preloaded file
mapped, no other libnccl mapped, and torch.cuda.nccl.version() must be ours (2.30.7). A
torch build that links NCCL statically would otherwise pass with NVIDIA's NCCL.

Needs torch with CUDA. Two ranks on one GPU: NCCL itself refuses duplicate GPUs; our
library allows it (several ranks per device is a design goal), so this also tests that.
"""
import datetime
import json
import os
import queue
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS, BATCH, DIN, DOUT, LR = 5, 32, 64, 16, 0.05
WORLD = 2
OUR_VERSION = (2, 30, 7)
TOL = 1e-4


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIN, 128), torch.nn.ReLU(), torch.nn.Linear(128, DOUT))


def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(BATCH, DIN, generator=g), torch.randn(BATCH, DOUT, generator=g)) for _ in range(STEPS)]


def train(m, data, rank=None, world=1):
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for x, y in data:
        if rank is not None:
            half = BATCH // world
            x, y = x[rank * half:(rank + 1) * half], y[rank * half:(rank + 1) * half]
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x.cuda()), y.cuda()).backward()
        opt.step()
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in m.parameters()]


def mapped_nccl_libs():
    """Paths of every mapped file whose name starts with libnccl."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and os.path.basename(parts[5]).startswith("libnccl"):
                libs.add(os.path.realpath(parts[5]))
    return sorted(libs)


def worker(rank, world, port, q):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120))
        m = torch.nn.parallel.DistributedDataParallel(model().cuda(), device_ids=[0])
        params = train(m, batches(), rank, world)
        dist.destroy_process_group()
        q.put({"rank": rank, "params": [p.tolist() for p in params],
               "nccl_version": list(torch.cuda.nccl.version()), "libs": mapped_nccl_libs()})
    except Exception:  # report, do not leave the parent waiting
        q.put({"rank": rank, "error": traceback.format_exc()})
        raise


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    out = sys.argv[1]
    if not torch.cuda.is_available():
        print("ddp: torch has no CUDA device: not runnable here")
        sys.exit(2)
    preload = [os.path.realpath(p) for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
               if os.path.basename(p).startswith("libnccl")]
    if not preload:
        print("ddp: LD_PRELOAD does not name a libnccl.so.2: nothing of ours would be tested")
        sys.exit(2)
    ref = train(model().cuda(), batches())
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, WORLD, port, q)) for r in range(WORLD)]
    for p in procs:
        p.start()
    reports, problems = {}, []
    try:
        while len(reports) < WORLD:
            r = q.get(timeout=600)
            reports[r["rank"]] = r
    except queue.Empty:
        problems.append("a worker did not report within 600 s")
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
                problems.append(f"worker pid {p.pid} had to be terminated")
    diff = float("nan")
    for rank, r in sorted(reports.items()):
        if "error" in r:
            problems.append(f"rank {rank} failed:\n{r['error']}")
            continue
        if tuple(r["nccl_version"]) != OUR_VERSION:
            problems.append(f"rank {rank}: torch.cuda.nccl.version() = {r['nccl_version']}, ours is {OUR_VERSION}")
        if preload[0] not in r["libs"] or len(r["libs"]) != 1:
            problems.append(f"rank {rank}: mapped libnccl files {r['libs']}, expected only {preload[0]}")
        got = [torch.tensor(t) for t in r["params"]]
        d = max(float((a - b).abs().max()) for a, b in zip(ref, got))
        diff = d if diff != diff else max(diff, d)
        if not d < TOL:
            problems.append(f"rank {rank}: max |param diff| {d:.3g} >= {TOL}")
    for p in procs:
        if p.exitcode != 0:
            problems.append(f"worker pid {p.pid} exit code {p.exitcode}")
    ok = not problems and len(reports) == WORLD
    with open(out, "w") as f:
        json.dump({"max_abs_diff": diff, "pass": ok, "problems": problems,
                   "nccl_version": [r.get("nccl_version") for r in reports.values()]}, f)
    for p in problems:
        print(f"ddp: {p}")
    print(f"ddp: {WORLD} processes on cuda:0, {STEPS} steps, max |param diff| vs single process {diff:.3g} -> {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
