# Writes tests/data/recipe/*.bin: PyTorch 1.13's answers for the training recipe of
# torchvision's references (optimizers over weight-decay groups, the per-epoch schedulers with
# their warm-up, clip_grad_norm_, the EMA model), for tests/test_optim.c.
#
# Run with Debian's torch: /usr/bin/python3 scripts/make_recipe_goldens.py
# Deterministic (fixed seeds): a rerun on the same torch rewrites the same bytes. The file
# format is scripts/make_op_goldens.py's ("mgt-golden 1", named f32/i32 arrays).
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import goldens_common  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "recipe")


def write(name, arrays):
    return goldens_common.write(OUT, name, arrays)


# ---- optimizers: three tensors in two weight-decay groups, four steps ----
# The C test lays the tensors out back to back (a 0..n0, b n0..n0+n1, c after) with group 0 =
# a and c's decay and group 1 = b's, as mgt_opt_group runs: a | b | c.
SIZES = (13, 7, 5)
STEPS = 4
LRS = (0.1, 0.05, 0.08, 0.02)  # a scheduler changes lr between steps
WD = (1e-2, 0.0)  # groups: "other" (a, c) and "norm"/"bias" (b)


def optimizer_case(name, make):
    g = torch.Generator().manual_seed(len(name) * 7919)
    ps = [torch.randn(n, generator=g).requires_grad_() for n in SIZES]
    init = [p.detach().clone() for p in ps]
    grads = [[torch.randn(n, generator=g) for n in SIZES] for _ in range(STEPS)]
    opt = make([{"params": [ps[0], ps[2]], "weight_decay": WD[0]},
                {"params": [ps[1]], "weight_decay": WD[1]}])
    arrays = [("sizes", list(SIZES)), ("lrs", list(LRS)), ("wd", list(WD)),
              ("init", torch.cat(init))]
    for t in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = LRS[t]
        # the C side gets twice these and grad_scale 0.5 (DDP's mean over two devices)
        for p, gr in zip(ps, grads[t]):
            p.grad = gr.clone()
        opt.step()
        arrays += [("grad%d" % t, torch.cat(grads[t]) * 2), ("param%d" % t, torch.cat(ps))]
    return write(name, arrays)


def optimizers():
    n = 0
    n += optimizer_case("sgd", lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9))
    n += optimizer_case("sgd_nesterov",
                        lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, nesterov=True))
    n += optimizer_case("sgd_nomomentum", lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.0))
    # train.py: AdamW(parameters, lr, weight_decay); RMSprop(..., eps=0.0316, alpha=0.9)
    n += optimizer_case("adamw", lambda g: torch.optim.AdamW(g, lr=0.1))
    n += optimizer_case("rmsprop", lambda g: torch.optim.RMSprop(g, lr=0.1, momentum=0.9,
                                                                 eps=0.0316, alpha=0.9))
    n += optimizer_case("rmsprop_nomomentum",
                        lambda g: torch.optim.RMSprop(g, lr=0.1, momentum=0.0, eps=0.0316,
                                                      alpha=0.9))
    return n


# ---- schedulers as train.py builds them, stepped once per epoch ----
def scheduler_case(name, kind, epochs, lr, step_size=30, gamma=0.1, lr_min=0.0, warmup=0,
                   method="constant", decay=0.01):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr)
    if kind == "steplr":
        main = torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma)
    elif kind == "cosineannealinglr":
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs - warmup,
                                                          eta_min=lr_min)
    else:
        main = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=gamma)
    sched = main
    if warmup > 0:
        if method == "linear":
            w = torch.optim.lr_scheduler.LinearLR(opt, start_factor=decay, total_iters=warmup)
        else:
            w = torch.optim.lr_scheduler.ConstantLR(opt, factor=decay, total_iters=warmup)
        sched = torch.optim.lr_scheduler.SequentialLR(opt, schedulers=[w, main],
                                                      milestones=[warmup])
    lrs = []
    for _ in range(epochs):
        lrs.append(opt.param_groups[0]["lr"])  # what the epoch trains with
        opt.step()
        sched.step()
    kinds = {"steplr": 0, "cosineannealinglr": 1, "exponentiallr": 2}
    config = [kinds[kind], epochs, step_size, warmup, 1 if method == "linear" else 0]
    return write("lr_" + name, [("config", config), ("params", [lr, gamma, lr_min, decay]),
                                ("lrs", lrs)])


def schedulers():
    n = 0
    n += scheduler_case("steplr", "steplr", 12, 0.5, step_size=3, gamma=0.5)
    n += scheduler_case("steplr_warmup", "steplr", 12, 0.5, step_size=4, gamma=0.1, warmup=3,
                        method="linear", decay=0.01)
    n += scheduler_case("cosine", "cosineannealinglr", 10, 0.5, lr_min=0.01)
    n += scheduler_case("cosine_warmup", "cosineannealinglr", 15, 0.8, warmup=5,
                        method="linear", decay=0.1)
    n += scheduler_case("cosine_constant", "cosineannealinglr", 8, 0.8, warmup=2,
                        method="constant", decay=0.25)
    n += scheduler_case("exponential", "exponentiallr", 10, 0.3, gamma=0.8, warmup=2,
                        method="constant", decay=0.01)
    return n


# ---- clip_grad_norm_ on two tensors, clipping and not ----
def clipping():
    g = torch.Generator().manual_seed(5)
    arrays = []
    for tag, max_norm in (("clip", 1.0), ("keep", 100.0)):
        ps = [torch.zeros(n, requires_grad=True) for n in (11, 6)]
        grads = [torch.randn(p.numel(), generator=g) for p in ps]
        for p, gr in zip(ps, grads):
            p.grad = gr.clone()
        total = torch.nn.utils.clip_grad_norm_(ps, max_norm)
        arrays += [(tag + ".max_norm", [max_norm]), (tag + ".grad", torch.cat(grads)),
                   (tag + ".norm", [float(total)]),
                   (tag + ".clipped", torch.cat([p.grad for p in ps]))]
    return write("clip", arrays)


# ---- the EMA: references/classification/utils.py's ExponentialMovingAverage ----
class ExponentialMovingAverage(torch.optim.swa_utils.AveragedModel):
    """utils.py's, as torchvision 0.14 has it."""

    def __init__(self, model, decay, device="cpu"):
        def ema_avg(avg_model_param, model_param, num_averaged):
            return decay * avg_model_param + (1 - decay) * model_param

        super().__init__(model, device, ema_avg, use_buffers=True)


def ema():
    # train.py's adjust for -b 16 on 2 devices, model_ema_steps 4, 10 epochs, decay 0.99
    world, batch, steps, epochs, decay = 2, 16, 4, 10, 0.99
    adjust = world * batch * steps / epochs
    alpha = min(1.0, (1.0 - decay) * adjust)
    g = torch.Generator().manual_seed(11)
    model = torch.nn.Linear(5, 3)
    e = ExponentialMovingAverage(model, decay=1.0 - alpha)
    arrays = [("config", [world * batch, steps, epochs]), ("decay", [decay, 1.0 - alpha])]
    for t in range(4):  # the first update copies, the rest average
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        e.update_parameters(model)
        w = torch.cat([p.detach().flatten() for p in model.parameters()])
        avg = torch.cat([p.detach().flatten() for p in e.module.parameters()])
        arrays += [("model%d" % t, w), ("ema%d" % t, avg)]
    return write("ema", arrays)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    total = optimizers() + schedulers() + clipping() + ema()
    print("wrote %d bytes to %s (torch %s)" % (total, os.path.normpath(OUT), torch.__version__))
