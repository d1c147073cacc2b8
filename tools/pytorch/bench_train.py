# Times PyTorch's CPU training step (forward, cross-entropy, backward, SGD) on synthetic data and prints images/s, for tools/compare-pytorch.sh.
"""One training-step benchmark in PyTorch, the counterpart of `mgtrain bench --dummy`.

A fixed random batch (inputs ~ N(0,1), labels uniform over the classes), made once and
reused like mgtrain's --dummy; SGD with momentum 0.9, weight decay 1e-4, lr 0.1;
cross-entropy loss; model in train mode (BatchNorm with batch statistics). The thread
count is fixed with torch.set_num_threads (and the environment variables, which the
caller should also set before Python starts). Prints one JSON object on stdout.
"""

import argparse
import json
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="resnet20")
    p.add_argument("-b", "--batch", type=int, default=128)
    p.add_argument("--image-size", type=int, default=28)
    p.add_argument("--in-channels", type=int, default=1)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--amp", default="", help="bf16: torch.autocast('cpu', torch.bfloat16) "
                   "around the forward (the loss in fp32 from its logits)")
    p.add_argument("--channels-last", action="store_true",
                   help="model and input in torch.channels_last")
    a = p.parse_args()

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var) != str(a.threads):
            print("bench_train.py: note: %s=%s, not %d (set it before starting Python)"
                  % (var, os.environ.get(var), a.threads), file=sys.stderr)
    import torch
    import torch.nn.functional as F
    import models

    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(a.seed)
    model = models.build(a.arch, a.classes, a.in_channels)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(a.batch, a.in_channels, a.image_size, a.image_size)
    y = torch.randint(0, a.classes, (a.batch,))
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    # multiply-accumulates of one image's convolutions and linear layers (THOP's count), for
    # GFLOP/s: a training step is about 3 of those passes, 2 flops each
    macs = [0]

    def count(m, inp, out):
        if isinstance(m, torch.nn.Conv2d):
            macs[0] += out[0].numel() * (m.in_channels // m.groups) * m.kernel_size[0] * \
                m.kernel_size[1]
        elif isinstance(m, torch.nn.Linear):
            macs[0] += out[0].numel() * m.in_features

    hs = [m.register_forward_hook(count) for m in model.modules()]
    with torch.no_grad():
        model.eval()(x[:1])
    for h in hs:
        h.remove()
    model.train()

    # the auxiliary classifiers' losses, as mgtrain trains them: main + weight x each
    aux_weight = {"inception_v3": 0.4, "googlenet": 0.3}.get(a.arch, 0.0)

    def loss_of(out):
        if isinstance(out, tuple):  # InceptionOutputs, GoogLeNetOutputs: logits first
            loss = F.cross_entropy(out[0].float(), y)
            for aux in out[1:]:
                loss = loss + aux_weight * F.cross_entropy(aux.float(), y)
            return loss
        return F.cross_entropy(out.float(), y)

    def forward():
        if a.amp == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(x)
        return model(x)

    phases = {"forward_s": [], "backward_s": [], "optimizer_s": []}

    def step():
        # CPU ops run synchronously, so the clock between the calls splits the step.
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = loss_of(forward())
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        phases["forward_s"].append(t1 - t0)
        phases["backward_s"].append(t2 - t1)
        phases["optimizer_s"].append(t3 - t2)
        return loss

    for _ in range(a.warmup):
        step()
    for v in phases.values():
        v.clear()
    times = []
    t_all = time.perf_counter()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - t_all
    times.sort()
    means = {k: sum(v) / len(v) for k, v in phases.items()}
    out = {
        "tool": "pytorch", "torch": torch.__version__, "arch": a.arch, "batch": a.batch,
        "image_size": a.image_size, "in_channels": a.in_channels, "threads": a.threads,
        "torch_threads": torch.get_num_threads(), "steps": a.steps, "warmup": a.warmup,
        "images_per_s": a.batch * a.steps / elapsed, "step_s": elapsed / a.steps,
        "step_s_median": times[len(times) // 2], "step_s_min": times[0],
        "loss": float(loss), "amp": a.amp, "channels_last": a.channels_last,
        "macs_per_image": macs[0], **means,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
