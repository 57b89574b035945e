#!/usr/bin/env python3
"""PyTorch DDP check for the GPU suite: 2 processes share cuda:0 (backend "nccl", our
libnccl.so.2 through LD_PRELOAD), train a small model for a few steps on their halves of
each batch; the parameters must match a single-process run on the concatenated batches
within float tolerance. Usage: LD_PRELOAD=/path/to/our/libnccl.so.2 ddp_check.py <out.json>
(spawns its own 2 workers; exit 0 pass, 1 fail, 2 not runnable here).

It also checks that OUR library did the work: every worker must have the preloaded file
mapped and no other libnccl, and ncclGetVersion of that file must say ours (2.30.7).
LD_PRELOAD alone is not enough for torch's pip wheels: torch/__init__.py loads
nvidia/nccl/lib/libnccl.so.2 by its full path from the first sys.path entry that has one
(seen on the GPU machine, 2026-11-27: NVIDIA's 2.28.9 was mapped beside ours). So before torch
is imported, this script puts a folder first on sys.path whose nvidia/nccl/lib/libnccl.so.2 is
a link to the preloaded file; spawned workers inherit sys.path. (torch.cuda.nccl.version() is
the version of the nccl.h torch was compiled with, not the loaded library's.)

Needs torch with CUDA. Two ranks on one GPU: NCCL itself refuses duplicate GPUs; our
library allows it (several ranks per device is a design goal), so this also tests that.
"""
import atexit
import ctypes
import datetime
import json
import os
import queue
import shutil
import socket
import sys
import tempfile
import traceback


def preloaded_nccl():
    """The libnccl files named by LD_PRELOAD (real paths)."""
    return [os.path.realpath(p) for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
            if os.path.basename(p).startswith("libnccl")]


def shadow_torch_nccl(lib):
    """Puts a folder first on sys.path where torch's loader finds `lib` as its NCCL (made by
    the first process, reused by the spawned workers, removed by the first at exit)."""
    d = os.environ.get("DDP_CHECK_OVERLAY")
    if not d:
        d = tempfile.mkdtemp(prefix="ccld-ddp-")
        atexit.register(shutil.rmtree, d, True)
    os.environ["DDP_CHECK_OVERLAY"] = d
    libdir = os.path.join(d, "nvidia", "nccl", "lib")
    os.makedirs(libdir, exist_ok=True)
    link = os.path.join(libdir, "libnccl.so.2")
    if not os.path.islink(link):
        os.symlink(lib, link)
    sys.path.insert(0, d)


if preloaded_nccl():
    shadow_torch_nccl(preloaded_nccl()[0])

import torch  # noqa: E402 (after the sys.path change above)
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

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


def runtime_version(lib):
    """ncclGetVersion of the library file `lib`, as (major, minor, patch)."""
    v = ctypes.c_int(0)
    if ctypes.CDLL(lib).ncclGetVersion(ctypes.byref(v)) != 0:
        return None
    code = v.value
    return (code // 10000, code // 100 % 100, code % 100) if code >= 10000 else (code // 1000, code // 100 % 10, code % 100)


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
               "compiled_nccl": list(torch.cuda.nccl.version()), "libs": mapped_nccl_libs()})
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
    preload = preloaded_nccl()
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
        if preload[0] not in r["libs"] or len(r["libs"]) != 1:
            problems.append(f"rank {rank}: mapped libnccl files {r['libs']}, expected only {preload[0]}")
        for lib in r["libs"]:
            got_v = runtime_version(lib)
            if got_v != OUR_VERSION:
                problems.append(f"rank {rank}: {lib} says ncclGetVersion {got_v}, ours is {OUR_VERSION}")
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
                   "libs": [r.get("libs") for r in reports.values()],
                   "torch_compiled_nccl": [r.get("compiled_nccl") for r in reports.values()]}, f)
    for p in problems:
        print(f"ddp: {p}")
    print(f"ddp: {WORLD} processes on cuda:0, {STEPS} steps, max |param diff| vs single process {diff:.3g} -> {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
