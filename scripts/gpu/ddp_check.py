#!/usr/bin/env python3
"""PyTorch DDP check for the GPU suite: 2 processes share cuda:0 (backend "nccl", our
libnccl.so.2 through LD_PRELOAD), train a small model for a few steps on their halves of
each batch; the parameters must match a single-process run on the concatenated batches
within float tolerance. Usage: ddp_check.py <out.json>  (spawns its own 2 workers).

Needs torch with CUDA. Two ranks on one GPU: NCCL itself refuses duplicate GPUs; our
library allows it (several ranks per device is a design goal), so this also tests that.
"""
import json, os, sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS, BATCH, DIN, DOUT, LR = 5, 32, 64, 16, 0.05


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
    return [p.detach().cpu() for p in m.parameters()]


def worker(rank, world, port, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    m = torch.nn.parallel.DistributedDataParallel(model().cuda(), device_ids=[0])
    params = train(m, batches(), rank, world)
    dist.destroy_process_group()
    if rank == 0:
        q.put([p.tolist() for p in params])


def main():
    out = sys.argv[1]
    ref = train(model().cuda(), batches())
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, 29517, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = [torch.tensor(t) for t in q.get(timeout=300)]
    for p in procs:
        p.join(timeout=60)
    diff = max(float((a - b).abs().max()) for a, b in zip(ref, got))
    ok = diff < 1e-4 and all(p.exitcode == 0 for p in procs)
    json.dump({"max_abs_diff": diff, "pass": ok}, open(out, "w"))
    print(f"ddp: max |param diff| {diff:.3g} -> {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
