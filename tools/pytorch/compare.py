# Runs mgtrain and PyTorch side by side (training step, two-device scaling, data loading), alternating runs, and prints medians and ratios; driven by tools/compare-pytorch.sh.
"""mgtrain against PyTorch on this machine: same model, batch, thread count, alternating runs.

Parts (--parts, comma-separated; default all):
  train  the training step on synthetic data: resnet20 1x28x28 batch 128 with 2 threads
         and with 1 thread, resnet18 3x224x224 batch 16 with 2 threads, in fp32 and with
         --amp bf16 (PyTorch: torch.autocast('cpu', torch.bfloat16)), --precisions picks;
         mgtrain on one mock device (`mgtrain bench --mock threads=N`), PyTorch with
         torch.set_num_threads(N) on jemalloc (LD_PRELOAD=libjemalloc.so.2,
         MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1: the tuned baseline, what the ratio
         is against) and, as a second column, on glibc's malloc; --channels-last runs
         PyTorch's model and input in channels_last, --python PATH another PyTorch (a venv).
         GFLOP/s: 6 x the conv and linear multiply-accumulates per image x images/s (a step
         is three such passes), for both tools.
  scale  resnet20 on two mock devices with one thread each against one device with one
         thread (same per-device batch): efficiency = img/s(2) / (2 img/s(1)); beside it
         PyTorch DDP (gloo, 2 processes, 1 thread each) against 1 plain process, 1 thread
  zoo    the training step of torchvision's other families on 3x224x224 synthetic images,
         in --precisions, --zoo-threads threads (2), batch --zoo-batch (8): --zoo-archs (resnet50,
         mobilenet_v2, vgg11_bn, densenet121, efficientnet_b0); an architecture mgtrain does
         not know fails its row and the others go on; --channels-last and --python apply
         here as in the train part
  transformers  vit_b_16 and swin_t: the training step at batch --tf-batch (8), 3x224x224,
         --tf-threads threads (2), fp32 and --amp bf16 (--precisions), against PyTorch (its
         MultiheadAttention's scaled_dot_product_attention for ViT; torchvision's Swin its
         matmuls); GFLOP/s from mgtrain's forward MACs (`mgtrain model`: the attention
         products and the functional linears included, which a conv + linear hook misses),
         as a fraction of --sgemm-peak, and mgtrain's attention share of its device time
         (`mgtrain bench --op-profile`)
  data   decode + augment images/s per thread: `mgtrain bench-data` against torchvision
         ImageFolder + DataLoader (num_workers 0, then 2), RandomResizedCrop(224) + flip on a
         generated tree of 500x375 JPEGs read three ways by mgtrain (the folder, a JPEG pack
         at --max-side 256, a raw pack at --max-side 256) and as a folder by torchvision
         (which has no pack: the folder is what a pack replaces); RandomCrop(28, padding=4) +
         flip on Fashion-MNIST's PNGs (folder, and a raw pack for mgtrain). torchvision runs
         with jemalloc (LD_PRELOAD=libjemalloc.so.2, MALLOC_CONF=dirty_decay_ms:-1,
         muzzy_decay_ms:-1) where it is installed: glibc's malloc returns its buffers to the
         system and faults them back, which costs PyTorch up to 2x here. Beside images/s per
         thread (wall time) both report images per CPU-second, which a loaded machine
         disturbs less.

Each comparison runs --rounds rounds; a round runs both tools, mgtrain first in even rounds
and PyTorch first in odd ones (A B B A ...), so slow drift in the machine's load falls on
both. The figures are the medians over the rounds; the ratio is mgtrain's median over
PyTorch's (above 1: mgtrain is faster).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return float("nan")


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=None):
    """x with `digits` decimals; by default 0 from 100 up, 1 below (resnet18's few img/s)."""
    if x is None:
        return "-"
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1
    return ("%%.%df" % digits) % x


class RunError(Exception):
    pass


class Ctx:
    def __init__(self, a):
        self.a = a
        self.tmp = tempfile.mkdtemp(prefix="mgt-compare-")
        self.raw = []  # every run, for --json
        self.failed = False

    def wait_quiet(self):
        a = self.a
        if a.wait_quiet <= 0:
            return
        t0 = time.time()
        while loadavg() > a.wait_quiet and time.time() - t0 < a.wait_max:
            time.sleep(5)

    def run(self, label, cmd, env=None):
        self.wait_quiet()
        load = loadavg()
        t0 = time.perf_counter()
        if self.a.verbose:
            print("  $ " + " ".join(cmd), flush=True)
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=self.a.timeout)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-6:])
            raise RunError("%s failed (exit %d): %s\n%s" % (label, p.returncode, " ".join(cmd), tail))
        return p.stdout, load, wall

    def torch_env(self, threads):
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = str(threads)
        for kv in self.a.torch_env:
            k, _, v = kv.partition("=")
            env[k] = v
        return env

    # ---- one run of each tool ----

    def mgt_bench(self, gpus, threads, arch, batch, size, chans, classes, steps, warmup):
        js = os.path.join(self.tmp, "bench.json")
        if os.path.exists(js):
            os.unlink(js)
        cmd = [self.a.mgtrain, "bench", "--device", "cpu", "--gpus", gpus,
               "--mock", "threads=%d" % threads, "--arch", arch, "-b", str(batch), "--dummy",
               "--image-size", str(size), "--in-channels", str(chans), "--classes", str(classes),
               "--steps", str(steps), "--warmup", str(warmup), "--json", js]
        if getattr(self, "amp_next", ""):
            cmd += ["--amp", self.amp_next]
        if getattr(self, "op_profile_next", False):
            cmd.append("--op-profile")
        _, load, wall = self.run("mgtrain bench", cmd)
        with open(js) as f:
            out = json.load(f)
        self.raw.append({"cmd": cmd, "load": load, "wall_s": wall, "out": out})
        return out, load

    def mgt_bench_profiled(self, amp, *args):
        self.amp_next = amp
        self.op_profile_next = True
        try:
            return self.mgt_bench(*args)
        finally:
            self.amp_next = ""
            self.op_profile_next = False

    def mgt_macs(self, arch, size):
        """mgtrain's forward multiply-accumulates per image (every layer, attention too)."""
        out, _, _ = self.run("mgtrain model", [self.a.mgtrain, "model", "-a", arch, "--size",
                                               str(size)])
        m = re.search(r"forward MACs per image:.*?\(([0-9,]+) ", out)
        if not m:
            raise RunError("mgtrain model: no 'forward MACs per image' line in:\n" + out)
        return int(m.group(1).replace(",", ""))

    def mgt_bench_amp(self, amp, *args):
        self.amp_next = amp
        try:
            return self.mgt_bench(*args)
        finally:
            self.amp_next = ""

    def torch_train(self, threads, arch, batch, size, chans, classes, steps, warmup, amp="",
                    malloc="jemalloc"):
        cmd = [self.a.python, os.path.join(HERE, "bench_train.py"), "--threads", str(threads),
               "--arch", arch, "-b", str(batch), "--image-size", str(size),
               "--in-channels", str(chans), "--classes", str(classes), "--steps", str(steps),
               "--warmup", str(warmup)]
        if amp:
            cmd += ["--amp", amp]
        if self.a.channels_last:
            cmd.append("--channels-last")
        env = self.torch_env(threads)
        if malloc == "jemalloc" and self.a.jemalloc:
            env["LD_PRELOAD"] = self.a.jemalloc
            env["MALLOC_CONF"] = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
        out, load, wall = self.run("bench_train.py", cmd, env)
        out = json.loads(out.strip().splitlines()[-1])
        self.raw.append({"cmd": cmd, "load": load, "wall_s": wall, "out": out})
        return out, load

    def torch_ddp(self, world, threads, batch, steps, warmup):
        cmd = [sys.executable, os.path.join(HERE, "bench_ddp.py"), "--world", str(world),
               "--threads", str(threads), "-b", str(batch), "--arch", "resnet20",
               "--image-size", "28", "--in-channels", "1", "--classes", "10",
               "--steps", str(steps), "--warmup", str(warmup)]
        out, load, wall = self.run("bench_ddp.py", cmd, self.torch_env(threads))
        out = json.loads(out.strip().splitlines()[-1])
        self.raw.append({"cmd": cmd, "load": load, "wall_s": wall, "out": out})
        return out, load

    def mgt_data(self, data, transform, size, threads, seconds):
        cmd = [self.a.mgtrain, "bench-data", "--data", data, "--transform", transform,
               "--size", str(size), "-j", str(threads), "-b", "64", "--seconds", str(seconds)]
        out, load, wall = self.run("mgtrain bench-data", cmd)
        m = re.search(r"loader: ([0-9.]+) images/s, ([0-9.]+) images/s per decode thread, "
                      r"([0-9.]+) images per CPU-second", out)
        if not m:
            raise RunError("mgtrain bench-data: no 'loader: N images/s' line in:\n" + out)
        res = {"images_per_s": float(m.group(1)), "images_per_s_per_thread": float(m.group(2)),
               "images_per_cpu_s": float(m.group(3))}
        self.raw.append({"cmd": cmd, "load": load, "wall_s": wall, "out": res, "stdout": out})
        return res, load

    def torch_data(self, data, transform, size, channels, workers, seconds):
        cmd = [sys.executable, os.path.join(HERE, "bench_data.py"), "--data", data,
               "--transform", transform, "--size", str(size), "--channels", str(channels),
               "--workers", str(workers), "-b", "64", "--seconds", str(seconds)]
        env = self.torch_env(1)
        if self.a.jemalloc:
            env["LD_PRELOAD"] = self.a.jemalloc
            env["MALLOC_CONF"] = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
        out, load, wall = self.run("bench_data.py", cmd, env)
        out = json.loads(out.strip().splitlines()[-1])
        self.raw.append({"cmd": cmd, "load": load, "wall_s": wall, "out": out})
        return out, load


def rotate(rounds, fns):
    """Runs every fn `rounds` times, the order rotating by one each round; returns the lists
    of results (one per fn) and the load averages seen."""
    res, loads = [[] for _ in fns], []
    for r in range(rounds):
        for k in range(len(fns)):
            i = (k + r) % len(fns)
            out, load = fns[i]()
            res[i].append(out)
            loads.append(load)
    return res, loads


def alternate(ctx, rounds, first, second):
    """Runs first() and second() `rounds` times, swapping their order every round; returns
    the two lists of results and the load averages seen."""
    r1, r2, loads = [], [], []
    for r in range(rounds):
        order = [(first, r1), (second, r2)]
        if r % 2:
            order.reverse()
        for fn, dst in order:
            res, load = fn()
            dst.append(res)
            loads.append(load)
    return r1, r2, loads


# ---- the comparisons ----

def part_train(ctx, rows, summary):
    a = ctx.a
    q = a.quick
    cases = [
        # label, arch, batch, size, channels, classes, threads, steps, warmup
        ("resnet20 1x28x28 b128 2 threads", "resnet20", 128, 28, 1, 10, 2,
         5 if q else 12, 1 if q else 2),
        ("resnet20 1x28x28 b128 1 thread", "resnet20", 128, 28, 1, 10, 1,
         3 if q else 8, 1 if q else 2),
        ("resnet18 3x224x224 b16 2 threads", "resnet18", 16, 224, 3, 1000, 2,
         2 if q else 4, 1),
    ]
    train_cases(ctx, rows, summary, cases, a.precisions)


def part_zoo(ctx, rows, summary):
    """torchvision's other families: 3x224x224 (ARCH:SIZE for another side), --zoo-threads,
    in each of --precisions (bf16: PyTorch's autocast against mgtrain's --amp bf16)."""
    a = ctx.a
    steps, warmup = (2, 1) if a.quick else (3, 1)
    cases = []
    for spec in a.zoo_archs:
        arch, _, size = spec.partition(":")
        size = int(size) if size else 224
        cases.append(("%s 3x%dx%d b%d %d thread%s" % (arch, size, size, a.zoo_batch,
                                                      a.zoo_threads,
                                                      "" if a.zoo_threads == 1 else "s"),
                      arch, a.zoo_batch, size, 3, 1000, a.zoo_threads, steps, warmup))
    train_cases(ctx, rows, summary, cases, a.precisions)


def train_cases(ctx, rows, summary, cases, precisions):
    a = ctx.a
    for label, arch, batch, size, chans, classes, threads, steps, warmup in cases:
        if not arch.startswith("resnet") or arch == "resnet18":
            if not a.have_torchvision:
                print("- %s: skipped (torchvision is not installed)" % label)
                continue
        for prec in precisions:
            amp = "" if prec == "f32" else prec
            lab = label + ("" if not amp else ", amp " + amp)
            print("- %s: %d rounds of %d steps after %d warm-up" % (lab, a.rounds, steps, warmup),
                  flush=True)
            args = (threads, arch, batch, size, chans, classes, steps, warmup)
            fns = [lambda: ctx.mgt_bench_amp(amp, "0", *args),
                   lambda: ctx.torch_train(*args, amp=amp, malloc="jemalloc")]
            if a.glibc:
                fns.append(lambda: ctx.torch_train(*args, amp=amp, malloc="glibc"))
            try:
                res, loads = rotate(a.rounds, fns)
            except (RunError, subprocess.TimeoutExpired) as e:
                print("  FAILED: %s" % e)
                ctx.failed = True
                continue
            m, t = res[0], res[1]
            g = res[2] if a.glibc else []
            mi = [r["results"][0]["images_per_s"] for r in m]
            ti = [r["images_per_s"] for r in t]
            gi = [r["images_per_s"] for r in g]
            pd = [r["results"][0]["per_device"][0] for r in m]
            mb = {k: med([p[k] for p in pd]) for k in ("forward_s", "backward_s", "optimizer_s",
                                                       "data_s")}
            tb = {k: med([r[k] for r in t]) for k in ("forward_s", "backward_s", "optimizer_s")}
            macs = t[0].get("macs_per_image", 0)
            ratio = med(mi) / med(ti)
            row = {"section": "train", "label": lab, "mgtrain": mi, "pytorch": ti,
                   "pytorch_glibc": gi, "ratio": ratio,
                   "ratio_glibc": med(mi) / med(gi) if gi else None, "loads": loads,
                   "mgt_phases": mb, "torch_phases": tb, "macs_per_image": macs,
                   "mgt_gflops": 6e-9 * macs * med(mi), "torch_gflops": 6e-9 * macs * med(ti)}
            rows.append(row)
            glibc = ("; pytorch glibc %s img/s, ratio %.2f"
                     % (" ".join(fmt(x) for x in gi), row["ratio_glibc"]) if gi else "")
            print("  mgtrain %s img/s, pytorch+jemalloc %s img/s, ratio %.2f%s (load %.1f..%.1f)"
                  % (" ".join(fmt(x) for x in mi), " ".join(fmt(x) for x in ti), ratio, glibc,
                     min(loads), max(loads)), flush=True)
            summary.append("%s: mgtrain %s img/s (%.1f GFLOP/s), pytorch+jemalloc %s img/s "
                           "(%.1f GFLOP/s), ratio %.2f%s"
                           % (lab, fmt(med(mi)), row["mgt_gflops"], fmt(med(ti)),
                              row["torch_gflops"], ratio,
                              ", against glibc %.2f" % row["ratio_glibc"] if gi else ""))


def part_transformers(ctx, rows, summary):
    """vit_b_16 and swin_t, batch --tf-batch, 224, --tf-threads, each precision."""
    a = ctx.a
    steps, warmup = (2, 1) if a.quick else (4, 1)
    for arch in ("vit_b_16", "swin_t"):
        macs = ctx.mgt_macs(arch, 224)
        for prec in a.precisions:
            amp = "" if prec == "f32" else prec
            lab = "%s 3x224x224 b%d %d threads%s" % (arch, a.tf_batch, a.tf_threads,
                                                     ", amp " + amp if amp else "")
            print("- %s: %d rounds of %d steps after %d warm-up" % (lab, a.rounds, steps, warmup),
                  flush=True)
            args = (a.tf_threads, arch, a.tf_batch, 224, 3, 1000, steps, warmup)
            fns = [lambda: ctx.mgt_bench_profiled(amp, "0", *args),
                   lambda: ctx.torch_train(*args, amp=amp, malloc="jemalloc")]
            try:
                res, loads = rotate(a.rounds, fns)
            except (RunError, subprocess.TimeoutExpired) as e:
                print("  FAILED: %s" % e)
                ctx.failed = True
                continue
            mi = [r["results"][0]["images_per_s"] for r in res[0]]
            ti = [r["images_per_s"] for r in res[1]]
            shares = []
            for r in res[0]:
                ops = r["results"][0].get("op_profile", [])
                total = sum(o["seconds"] for o in ops)
                att = sum(o["seconds"] for o in ops if o["op"].startswith("attention_"))
                shares.append(att / total if total else None)
            ratio = med(mi) / med(ti)
            gm, gt = 6e-9 * macs * med(mi), 6e-9 * macs * med(ti)
            row = {"section": "transformers", "label": lab, "mgtrain": mi, "pytorch": ti,
                   "ratio": ratio, "loads": loads, "macs_per_image": macs, "mgt_gflops": gm,
                   "torch_gflops": gt, "attention_share": med(shares)}
            rows.append(row)
            print("  mgtrain %s img/s (%.1f GFLOP/s, %.0f%% of peak), pytorch+jemalloc %s img/s "
                  "(%.1f GFLOP/s, %.0f%%), ratio %.2f; attention %.1f%% of mgtrain's device "
                  "time (load %.1f..%.1f)"
                  % (" ".join(fmt(x) for x in mi), gm, 100 * gm / a.sgemm_peak,
                     " ".join(fmt(x) for x in ti), gt, 100 * gt / a.sgemm_peak, ratio,
                     100 * (med(shares) or 0), min(loads), max(loads)), flush=True)
            summary.append("%s: mgtrain %s img/s (%.1f GFLOP/s, %.0f%% of the sgemm peak), "
                           "pytorch+jemalloc %s img/s (%.1f GFLOP/s), ratio %.2f, attention "
                           "%.1f%% of mgtrain's step"
                           % (lab, fmt(med(mi)), gm, 100 * gm / a.sgemm_peak, fmt(med(ti)), gt,
                              ratio, 100 * (med(shares) or 0)))


def part_scale(ctx, rows, summary):
    a = ctx.a
    b = a.scale_batch
    steps, warmup = (4, 1) if a.quick else (16, 3)
    label = "scaling resnet20 b%d/device 1 thread/device" % b
    print("- %s: %d rounds of %d steps after %d warm-up" % (label, a.rounds, steps, warmup),
          flush=True)

    torch_failed = []

    def torch_pair():
        # PyTorch's side failing (gloo can hang or die on a busy machine) loses only its
        # column: mgtrain's figures still count
        try:
            one, l1 = ctx.torch_ddp(1, 1, b, steps, warmup)
            two, l2 = ctx.torch_ddp(2, 1, b, steps, warmup)
        except (RunError, subprocess.TimeoutExpired) as e:
            torch_failed.append(str(e).splitlines()[0])
            return None, loadavg()
        return (one, two), max(l1, l2)

    try:
        m, t, loads = alternate(
            ctx, a.rounds,
            lambda: ctx.mgt_bench("0,1", 1, "resnet20", b, 28, 1, 10, steps, warmup),
            torch_pair)
    except (RunError, subprocess.TimeoutExpired) as e:
        print("  FAILED: %s" % e)
        ctx.failed = True
        return
    m1 = [r["results"][0]["images_per_s"] for r in m]
    m2 = [r["results"][-1]["images_per_s"] for r in m]
    me = [y / (2 * x) for x, y in zip(m1, m2)]
    t = [r for r in t if r is not None]
    if torch_failed:
        print("  pytorch DDP failed in %d of %d rounds: %s" % (len(torch_failed), a.rounds,
                                                               torch_failed[0]), flush=True)
    if not t:
        print("  mgtrain efficiency %s; no PyTorch DDP figures"
              % " ".join("%.1f%%" % (100 * e) for e in me), flush=True)
        rows.append({"section": "scale", "label": label, "mgtrain_1": m1, "mgtrain_2": m2,
                     "mgtrain_eff": me, "pytorch_failed": torch_failed})
        summary.append("%s: mgtrain 2 devices %.1f%% efficiency (1: %s, 2: %s img/s), "
                       "pytorch DDP failed" % (label, 100 * med(me), fmt(med(m1)),
                                               fmt(med(m2))))
        return
    t1 = [one["images_per_s"] for one, _ in t]
    t2 = [two["images_per_s"] for _, two in t]
    te = [y / (2 * x) for x, y in zip(t1, t2)]
    exposed = med([max(d["reduce_exposed_s"] for d in r["results"][-1]["per_device"]) for r in m])
    spread = med([r["results"][-1].get("spread_s", 0) for r in m])
    rows.append({"section": "scale", "label": label, "mgtrain_1": m1, "mgtrain_2": m2,
                 "mgtrain_eff": me, "pytorch_1": t1, "pytorch_2": t2, "pytorch_eff": te,
                 "loads": loads, "mgt_reduce_exposed_s": exposed, "mgt_spread_s": spread,
                 "ratio_eff": med(me) / med(te), "ratio_2": med(m2) / med(t2)})
    print("  mgtrain efficiency %s, pytorch DDP efficiency %s (load %.1f..%.1f)"
          % (" ".join("%.1f%%" % (100 * e) for e in me), " ".join("%.1f%%" % (100 * e) for e in te),
             min(loads), max(loads)), flush=True)
    summary.append("%s: mgtrain 2 devices %.1f%% efficiency (1: %s, 2: %s img/s), pytorch DDP "
                   "gloo 2 processes %.1f%% (1: %s, 2: %s img/s), efficiency ratio %.2f, "
                   "2-device img/s ratio %.2f"
                   % (label, 100 * med(me), fmt(med(m1)), fmt(med(m2)), 100 * med(te),
                      fmt(med(t1)), fmt(med(t2)), med(me) / med(te), med(m2) / med(t2)))


def warm_page_cache(path):
    """Reads every file under path once, so that no tool pays for the disk (the first to
    run after a cold cache would, and Fashion-MNIST is 60000 small files)."""
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                with open(os.path.join(dirpath, f), "rb") as fh:
                    while fh.read(1 << 20):
                        pass
            except OSError:
                pass


def find_jemalloc():
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"):
        p = os.path.join(d, "libjemalloc.so.2")
        if os.path.exists(p):
            return p
    return ""


def make_pack(ctx, src, out, fmt, max_side):
    """mgtrain pack, once (the pack is kept beside the tree and made again when missing)."""
    if os.path.exists(out):
        return True
    p = subprocess.run([ctx.a.mgtrain, "pack", "--data", src, "--out", out, "--format", fmt,
                        "--max-side", str(max_side), "-q"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print("- data: could not pack %s: %s" % (src, p.stdout.strip()))
        return False
    return True


def part_data(ctx, rows, summary):
    a = ctx.a
    if not a.have_torchvision:
        print("- data: skipped (torchvision is not installed)")
        return
    seconds = 2 if a.quick else 3
    a.jemalloc = find_jemalloc()
    sets = []  # label, mgtrain's data, torchvision's data, transform, size, channels
    if not a.images:
        a.images = os.path.join(tempfile.gettempdir(), "mgt-compare-jpeg500")
    gen = subprocess.run([sys.executable, os.path.join(HERE, "make_images.py"), a.images,
                          "--count", "400", "--width", "500", "--height", "375"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if gen.returncode != 0:
        print("- data: could not generate the JPEG tree: %s" % gen.stdout.strip())
    else:
        sets.append(("folder JPEG rrc224", a.images, a.images, "rrc", 224, 3))
        jp, rp = a.images + "-jpeg256.pack", a.images + "-raw256.pack"
        if make_pack(ctx, a.images, jp, "jpeg", 256):
            sets.append(("packed JPEG (256) rrc224", jp, a.images, "rrc", 224, 3))
        if make_pack(ctx, a.images, rp, "raw", 256):
            sets.append(("packed raw (256) rrc224", rp, a.images, "rrc", 224, 3))
    if a.fmnist and os.path.isdir(a.fmnist):
        sets.append(("Fashion-MNIST PNG pad-crop28", a.fmnist, a.fmnist, "pad-crop", 28, 1))
        fp = os.path.join(tempfile.gettempdir(), "mgt-compare-fmnist-raw.pack")
        if make_pack(ctx, a.fmnist, fp, "raw", 0):
            sets.append(("Fashion-MNIST packed raw pad-crop28", fp, a.fmnist, "pad-crop", 28, 1))
    else:
        print("- data: no Fashion-MNIST tree at %s (mgtrain import-idx makes one); skipped"
              % a.fmnist)
    print("- data: images/s per thread; JPEG rows: %s, 400 generated 500x375 JPEGs (quality 90), "
          "RandomResizedCrop(224) + flip + ToTensor + Normalize, RGB; packs by mgtrain pack "
          "--max-side 256 (the images' longer side 256); torchvision reads the folder in every "
          "JPEG row. Fashion-MNIST rows: %s, 28x28 gray PNGs, RandomCrop(28, padding=4) + flip + "
          "ToTensor + Normalize. torchvision 1 thread = num_workers 0, 2 threads = num_workers 2; "
          "%s" % (a.images, a.fmnist, "jemalloc for torchvision: %s" % a.jemalloc if a.jemalloc
                  else "jemalloc not found: torchvision on glibc's malloc"))
    for name, mpath, tpath, transform, size, chans in sets:
        for path in (mpath, tpath):
            train = os.path.join(path, "train")
            warm_page_cache(train if os.path.isdir(train) else path)
        for threads in (1, 2):
            label = "data %s %d thread%s" % (name, threads, "s" if threads > 1 else "")
            print("- %s: %d rounds of %g s" % (label, a.rounds, seconds), flush=True)
            try:
                m, t, loads = alternate(
                    ctx, a.rounds,
                    lambda: ctx.mgt_data(mpath, transform, size, threads, seconds),
                    lambda: ctx.torch_data(tpath, transform, size, chans,
                                           0 if threads == 1 else threads, seconds))
            except (RunError, subprocess.TimeoutExpired) as e:
                print("  FAILED: %s" % e)
                ctx.failed = True
                continue
            mi = [r["images_per_s_per_thread"] for r in m]
            ti = [r["images_per_s_per_thread"] for r in t]
            mc = [r.get("images_per_cpu_s") for r in m]
            tc = [r.get("images_per_cpu_s") for r in t]
            ratio = med(mi) / med(ti)
            cpu_ratio = med(mc) / med(tc) if med(mc) and med(tc) else None
            rows.append({"section": "data", "label": label, "mgtrain": mi, "pytorch": ti,
                         "ratio": ratio, "loads": loads, "cpu_ratio": cpu_ratio,
                         "mgtrain_cpu": mc, "pytorch_cpu": tc})
            print("  mgtrain %s, torchvision %s img/s/thread, ratio %.2f; per CPU-second %s and "
                  "%s, ratio %s"
                  % (" ".join(fmt(x) for x in mi), " ".join(fmt(x) for x in ti), ratio,
                     fmt(med(mc)), fmt(med(tc)), "%.2f" % cpu_ratio if cpu_ratio else "-"),
                  flush=True)
            summary.append("%s: mgtrain %s img/s/thread, torchvision %s img/s/thread, "
                           "ratio %.2f (per CPU-second %s)" % (label, fmt(med(mi)), fmt(med(ti)),
                                                               ratio, "%.2f" % cpu_ratio
                                                               if cpu_ratio else "-"))


def print_table(rows):
    def runs(xs, digits=None):
        return "%s (%s)" % (fmt(med(xs), digits), " ".join(fmt(x, digits) for x in xs))

    print()
    print("%-48s %-24s %-24s %6s  %s" % ("comparison (img/s: median (runs))", "mgtrain",
                                          "pytorch", "ratio", "load"))
    for r in rows:
        ld = "%.1f-%.1f" % (min(r["loads"]), max(r["loads"]))
        if r["section"] == "scale":
            print("%-48s %-24s %-24s %6s  %s" % (r["label"], "", "", "", ld))
            print("%-48s %-24s %-24s %6s" % ("  1 device (pytorch: 1 process, no DDP)", runs(r["mgtrain_1"]),
                                                  runs(r["pytorch_1"]), ""))
            print("%-48s %-24s %-24s %6.2f" % ("  2 devices (pytorch: DDP gloo, 2 processes)",
                                               runs(r["mgtrain_2"]), runs(r["pytorch_2"]),
                                               r["ratio_2"]))
            print("%-48s %-24s %-24s %6.2f" % (
                "  efficiency img/s(2) / (2 img/s(1)), %",
                runs([100 * e for e in r["mgtrain_eff"]], 1),
                runs([100 * e for e in r["pytorch_eff"]], 1), r["ratio_eff"]))
            print("%-48s exposed reduce %.1f ms/step, device spread %.1f ms"
                  % ("  mgtrain, 2 devices (medians)", 1e3 * r["mgt_reduce_exposed_s"],
                     1e3 * r["mgt_spread_s"]))
            continue
        label = r["label"] + (" /thread" if r["section"] == "data" else "")
        print("%-48s %-24s %-24s %6.2f  %s" % (label, runs(r["mgtrain"]), runs(r["pytorch"]),
                                               r["ratio"], ld))
        if r["section"] == "data" and r.get("cpu_ratio"):
            print("%-48s %-24s %-24s %6.2f" % ("  images per CPU-second", runs(r["mgtrain_cpu"]),
                                               runs(r["pytorch_cpu"]), r["cpu_ratio"]))
        if r["section"] == "train" and r.get("pytorch_glibc"):
            print("%-48s %-24s %-24s %6.2f" % ("  pytorch on glibc malloc (untuned)", "",
                                               runs(r["pytorch_glibc"]), r["ratio_glibc"]))
        if r["section"] == "train":
            print("%-48s %-24s %-24s" % ("  GFLOP/s (6 x conv+fc MACs x img/s)",
                                         fmt(r["mgt_gflops"], 1), fmt(r["torch_gflops"], 1)))
            mp, tp = r["mgt_phases"], r["torch_phases"]
            def phases(ph):
                return "%.0f/%.0f/%.1f" % (1e3 * ph["forward_s"], 1e3 * ph["backward_s"],
                                           1e3 * ph["optimizer_s"])
            print("%-48s %-24s %-24s" % ("  ms/step forward/backward/optimizer", phases(mp),
                                         phases(tp)))


def main():
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mgtrain", default=os.environ.get("MGTRAIN", os.path.join(ROOT, "build", "mgtrain")),
                   help="the mgtrain binary (default: $MGTRAIN or build/mgtrain)")
    p.add_argument("--parts", default="train,scale,data",
                   help="train,scale,zoo,transformers,data (default: train,scale,data)")
    p.add_argument("--zoo-archs", default="resnet50,mobilenet_v2,vgg11_bn,densenet121,efficientnet_b0",
                   help="zoo part: the architectures, comma-separated, each ARCH or ARCH:SIDE "
                        "(224 by default; inception_v3's auxiliary classifier needs 299)")
    p.add_argument("--zoo-threads", type=int, default=2, help="zoo part: threads (2)")
    p.add_argument("--zoo-batch", type=int, default=8, help="zoo part: batch (8)")
    p.add_argument("--tf-threads", type=int, default=2, help="transformers part: threads (2)")
    p.add_argument("--tf-batch", type=int, default=8, help="transformers part: batch (8)")
    p.add_argument("--sgemm-peak", type=float, default=185.0,
                   help="the machine's sgemm GFLOP/s on the threads compared (185: AMD EPYC Zen 4, "
                        "2 threads), for the fraction of peak")
    p.add_argument("--quick", action="store_true", help="1 round, fewer steps (about 2 minutes)")
    p.add_argument("--rounds", type=int, default=0, help="rounds per comparison (default 3; --quick 1)")
    p.add_argument("--scale-batch", type=int, default=64, help="per-device batch of the scaling part (64)")
    p.add_argument("--images", default="", help="JPEG tree for the data part (generated; default /tmp/mgt-compare-jpeg500)")
    p.add_argument("--fmnist", default=os.path.join(ROOT, "data", "fashion-mnist"),
                   help="Fashion-MNIST ImageFolder tree (default data/fashion-mnist)")
    p.add_argument("--torch-env", action="append", default=[], metavar="VAR=VALUE",
                   help="extra environment for the PyTorch runs only (repeatable)")
    p.add_argument("--wait-quiet", type=float, default=0, metavar="LOAD",
                   help="before each run, wait until the 1-minute load average is below LOAD")
    p.add_argument("--wait-max", type=float, default=120, help="longest such wait, seconds (120)")
    p.add_argument("--timeout", type=float, default=900, help="limit per run, seconds")
    p.add_argument("--json", default="", help="write every run's raw results here")
    p.add_argument("-v", "--verbose", action="store_true", help="print each command")
    p.add_argument("--python", default=sys.executable,
                   help="the Python whose PyTorch the train and zoo parts run (a venv's; "
                        "default this one)")
    p.add_argument("--precisions", default="f32,bf16",
                   help="train, zoo and transformers parts: f32 and/or bf16 (mgtrain --amp "
                        "bf16 against autocast)")
    p.add_argument("--channels-last", action="store_true",
                   help="train and zoo parts: PyTorch's model and input in channels_last")
    p.add_argument("--no-glibc", dest="glibc", action="store_false",
                   help="train part: skip the second PyTorch column (glibc's malloc)")
    a = p.parse_args()
    a.precisions = [x for x in a.precisions.split(",") if x]
    a.zoo_archs = [x for x in a.zoo_archs.split(",") if x]
    for x in a.precisions:
        if x not in ("f32", "bf16"):
            p.error("unknown precision %r" % x)
    a.jemalloc = find_jemalloc()
    if not a.jemalloc:
        print("compare-pytorch: libjemalloc.so.2 not found (Debian: libjemalloc2): PyTorch runs "
              "on glibc's malloc, an untuned baseline, in both columns")
    a.rounds = a.rounds or (1 if a.quick else 3)
    parts = [x for x in a.parts.split(",") if x]
    for x in parts:
        if x not in ("train", "scale", "zoo", "transformers", "data"):
            p.error("unknown part %r" % x)

    try:
        import torch
    except ImportError:
        print("compare-pytorch: PyTorch is not installed for %s; the comparison is optional "
              "(Debian: apt-get install python3-torch python3-torchvision). Nothing to compare."
              % sys.executable)
        return 0
    try:
        import torchvision
        a.have_torchvision = True
        tv = torchvision.__version__
    except ImportError:
        a.have_torchvision = False
        tv = None
        print("compare-pytorch: torchvision is not installed (optional; Debian: apt-get install "
              "python3-torchvision): resnet18 and the data comparison are skipped.")
    if not os.access(a.mgtrain, os.X_OK):
        print("compare-pytorch: no mgtrain binary at %s (build it, or pass --mgtrain PATH)"
              % a.mgtrain, file=sys.stderr)
        return 2

    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print("compare-pytorch: %s; pytorch %s (%s), torchvision %s; %d cores (%s); load %.2f; "
          "%d round%s per comparison%s"
          % (a.mgtrain, torch.__version__, sys.executable, tv, os.cpu_count(), cpu, loadavg(),
             a.rounds, "s" if a.rounds > 1 else "", ", quick" if a.quick else ""), flush=True)
    if os.path.realpath(a.python) != os.path.realpath(sys.executable):
        try:
            other = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True, timeout=120).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            other = ""
        print("compare-pytorch: the train and zoo parts run pytorch %s (%s); the others the one "
              "above"
              % (other or "(not importable)", a.python), flush=True)
    if a.torch_env:
        print("compare-pytorch: extra PyTorch environment: %s" % " ".join(a.torch_env))

    ctx = Ctx(a)
    rows, summary = [], []
    t0 = time.time()
    if "train" in parts:
        part_train(ctx, rows, summary)
    if "scale" in parts:
        part_scale(ctx, rows, summary)
    if "zoo" in parts:
        part_zoo(ctx, rows, summary)
    if "transformers" in parts:
        part_transformers(ctx, rows, summary)
    if "data" in parts:
        part_data(ctx, rows, summary)
    print_table(rows)
    print("\n(%.0f s in all; load average now %.2f on %d cores: a loaded machine lowers both "
          "tools' numbers, unevenly)\n" % (time.time() - t0, loadavg(), os.cpu_count()))
    for line in summary:
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "runs": ctx.raw}, f, indent=1)
    return 1 if ctx.failed else 0


if __name__ == "__main__":
    sys.exit(main())
