# Times PyTorch DistributedDataParallel (gloo, N processes on this machine, T threads each) on synthetic data, for the scaling comparison in tools/compare-pytorch.sh.
"""PyTorch DDP scaling benchmark on CPU, the counterpart of `mgtrain bench --gpus 0,1`.

--world 1 runs the plain single-process step (no DDP wrapper, no communication), the
baseline that `mgtrain bench` uses for its one-device row; --world N>1 starts N processes
(torch.multiprocessing, gloo, file:// rendezvous in a temporary folder), each with the same
per-process batch, model seed and --threads intra-op threads, wrapped in
DistributedDataParallel with its default 25 MiB buckets. Images/s is the total over all
processes: world * batch * steps / the slowest process's elapsed time. Prints one JSON
object on stdout.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def worker(rank, a, init_file, queue):
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import models

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    if a.world > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file,
                                rank=rank, world_size=a.world)
    torch.manual_seed(a.seed)
    model = models.build(a.arch, a.classes, a.in_channels)
    model.train()
    net = model
    if a.world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_mb)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    g = torch.Generator().manual_seed(a.seed + 1 + rank)
    x = torch.randn(a.batch, a.in_channels, a.image_size, a.image_size, generator=g)
    y = torch.randint(0, a.classes, (a.batch,), generator=g)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    if a.world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    elapsed = time.perf_counter() - t0
    if a.world > 1:
        t = torch.tensor([elapsed], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        elapsed = float(t)
    # the result goes out before the process group is torn down: gloo's teardown can hang
    # when the other rank has already left, and the parent must not wait on it
    if rank == 0:
        queue.put(elapsed)
    if a.world > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--arch", default="resnet20")
    p.add_argument("-b", "--batch", type=int, default=64, help="per process")
    p.add_argument("--image-size", type=int, default=28)
    p.add_argument("--in-channels", type=int, default=1)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="per process")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    import queue as queue_mod
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="mgt-ddp-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        if a.world == 1:
            worker(0, a, init_file, queue)
            elapsed = queue.get()
        else:
            procs = mp.spawn(worker, args=(a, init_file, queue), nprocs=a.world, join=False)
            elapsed = None
            while elapsed is None:
                try:
                    elapsed = queue.get(timeout=1.0)
                except queue_mod.Empty:
                    # a rank that died makes the others wait forever: give up on it
                    dead = [p.exitcode for p in procs.processes if p.exitcode not in (None, 0)]
                    if dead:
                        for p in procs.processes:
                            p.kill()
                        sys.exit("bench_ddp: a rank exited with status %d" % dead[0])
            for p in procs.processes:
                p.join(timeout=30)
                if p.is_alive():  # stuck in teardown; its numbers are in
                    p.kill()
    import torch
    out = {
        "tool": "pytorch-ddp" if a.world > 1 else "pytorch", "torch": torch.__version__,
        "backend": "gloo" if a.world > 1 else None, "world": a.world, "arch": a.arch,
        "per_process_batch": a.batch, "threads_per_process": a.threads, "steps": a.steps,
        "images_per_s": a.world * a.batch * a.steps / elapsed, "step_s": elapsed / a.steps,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
