# Writes tests/data/syncbn/*.bin: SyncBatchNorm's arithmetic as PyTorch 1.13 runs it
# (torch/nn/modules/_functions.py), for the --sync-bn ops' and training's tests.
#
# batch_norm_stats and friends are CUDA-only in 1.13, so the script spells their arithmetic out
# (per-shard mean/invstd/count -> Welford merge in shard order -> elementwise; backward reduce
# -> sum over shards -> backward elementwise) and asserts that it equals F.batch_norm over the
# concatenated batch (forward, running statistics, and autograd's dx, dweight, dbias) before
# writing. Shards have unequal counts (a short last batch on one device).
# Run with Debian's torch: /usr/bin/python3 scripts/make_syncbn_goldens.py
# Deterministic (fixed seed). The file format is scripts/make_op_goldens.py's ("mgt-golden 1").
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldens_common  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "syncbn")


def write(name, arrays):
    return goldens_common.write(OUT, name, arrays)


def sync_bn(shards, w, b, rm, rv, dys, momentum, eps):
    """SyncBatchNorm.forward/backward of _functions.py, one shard per device, float64."""
    red = lambda t: t.transpose(0, 1).flatten(1)  # (C, N*H*W)
    means, invstds, counts = [], [], []
    for x in shards:  # batch_norm_stats: biased variance
        xc = red(x)
        m = xc.mean(1)
        means.append(m)
        invstds.append(1.0 / torch.sqrt(((xc - m[:, None]) ** 2).mean(1) + eps))
        counts.append(xc.shape[1])
    # batch_norm_gather_stats_with_counts: Welford merge in the all_gather's (shard) order
    mean = torch.zeros_like(means[0])
    m2 = torch.zeros_like(means[0])
    n = 0
    for mi, ii, ci in zip(means, invstds, counts):
        var_n = (1.0 / ii**2 - eps) * ci
        nt = n + ci
        delta = mi - mean
        mean = mean + delta * ci / nt
        m2 = m2 + var_n + delta**2 * n * ci / nt
        n = nt
    invstd = 1.0 / torch.sqrt(m2 / n + eps)
    rm_new = (1 - momentum) * rm + momentum * mean
    rv_new = (1 - momentum) * rv + momentum * m2 / (n - 1)
    ys = [(x - mean[None, :, None, None]) * (invstd * w)[None, :, None, None] + b[None, :, None, None]
          for x in shards]
    # backward: batch_norm_backward_reduce per shard, all_reduce(sum), backward_elemt
    sdy, sdx, gw, gb = [], [], [], []
    for x, dy in zip(shards, dys):
        xmu = red(x) - mean[:, None]
        sdy.append(red(dy).sum(1))
        sdx.append((red(dy) * xmu).sum(1))
        gw.append(sdx[-1] * invstd)
        gb.append(sdy[-1])
    sum_dy = sum(sdy)
    sum_dy_xmu = sum(sdx)
    dxs = []
    for x, dy in zip(shards, dys):
        xmu = x - mean[None, :, None, None]
        dx = (dy - (sum_dy / n)[None, :, None, None]
              - xmu * (invstd**2 * sum_dy_xmu / n)[None, :, None, None]) * (invstd * w)[None, :, None, None]
        dxs.append(dx)
    return dict(means=means, invstds=invstds, counts=counts, mean=mean, invstd=invstd, rm=rm_new,
                rv=rv_new, ys=ys, sum_dy=sdy, sum_dy_xmu=sdx, gw=gw, gb=gb, dxs=dxs)


def case(name, sizes, c, hw, seed):
    g = torch.Generator().manual_seed(seed)
    shards = [torch.randn(s, c, hw, hw, generator=g, dtype=torch.float64) * 1.7 + 0.3 for s in sizes]
    dys = [torch.randn(s, c, hw, hw, generator=g, dtype=torch.float64) for s in sizes]
    w = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    b = torch.randn(c, generator=g, dtype=torch.float64)
    rm = torch.randn(c, generator=g, dtype=torch.float64) * 0.1
    rv = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    momentum, eps = 0.1, 1e-5
    r = sync_bn(shards, w, b, rm, rv, dys, momentum, eps)

    # the check: batch_norm over the concatenated batch gives the same
    x = torch.cat(shards).requires_grad_(True)
    wt = w.clone().requires_grad_(True)
    bt = b.clone().requires_grad_(True)
    rmt, rvt = rm.clone(), rv.clone()
    y = F.batch_norm(x, rmt, rvt, wt, bt, training=True, momentum=momentum, eps=eps)
    y.backward(torch.cat(dys))
    close = lambda a, e: torch.allclose(a, e, rtol=1e-9, atol=1e-11)
    assert close(torch.cat(r["ys"]), y), name
    assert close(r["rm"], rmt) and close(r["rv"], rvt), name
    assert close(torch.cat(r["dxs"]), x.grad), name
    assert close(sum(r["gw"]), wt.grad) and close(sum(r["gb"]), bt.grad), name

    arrays = [("sizes", list(sizes)), ("shape", [c, hw, hw]), ("momentum", [momentum]), ("eps", [eps]),
              ("weight", w), ("bias", b), ("running_mean", rm), ("running_var", rv)]
    for i in range(len(sizes)):
        arrays += [("x%d" % i, shards[i]), ("dy%d" % i, dys[i]), ("mean%d" % i, r["means"][i]),
                   ("invstd%d" % i, r["invstds"][i]), ("sum_dy%d" % i, r["sum_dy"][i]),
                   ("sum_dy_xmu%d" % i, r["sum_dy_xmu"][i]), ("grad_weight%d" % i, r["gw"][i]),
                   ("grad_bias%d" % i, r["gb"][i]), ("y%d" % i, r["ys"][i]), ("dx%d" % i, r["dxs"][i])]
    arrays += [("mean", r["mean"]), ("invstd", r["invstd"]), ("running_mean_out", r["rm"]),
               ("running_var_out", r["rv"]), ("grad_weight", wt.grad), ("grad_bias", bt.grad)]
    print(name, write(name, arrays), "bytes")


os.makedirs(OUT, exist_ok=True)
case("three_unequal", (4, 3, 1), 3, 3, 1)  # a short shard, a one-sample shard
case("two_equal", (2, 2), 5, 2, 2)
