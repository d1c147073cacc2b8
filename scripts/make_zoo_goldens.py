#!/usr/bin/python3
"""Goldens of the zoo (tests/data/zoo/ARCH_CxSxS.golden.safetensors) from torchvision 0.14's
own models in float64: weights by a formula both sides compute (weights()), a fixed input of
two images, the eval logits, then one training step (label smoothing 0.1) with its logits,
loss, every parameter gradient, and the state after one SGD step (lr 0.1, momentum 0.9,
weight decay 5e-4), or for the transformers one AdamW step (lr 1e-3, weight decay 0.05, the
recipe's optimizer; metadata "optimizer"). Dropout layers are replaced by the mask mgtrain draws (mgt_dropout_key in
include/mgt/device.h: Philox4x32-10, seed 7, step 1, sample0 0, stride 1, stream = the
layer's place among the model's dropout layers). Big tensors are kept as their norm and 64
hashed samples (make_model_goldens.py's sample_index); tests/test_zoo.c recomputes the rest.

Usage: scripts/make_zoo_goldens.py [ARCH ...] (default: every case of CASES)"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_goldens import hash_uniform, save_safetensors, sample_index, f32  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "zoo")
LR, MOMENTUM, WD, SMOOTHING = 0.1, 0.9, 5e-4, 0.1
TOL_FWD = 2e-5  # test_zoo's
CLASSES, BATCH = 10, 2
# one image where the smallest input is large (the golden keeps the whole input)
ONE_IMAGE = {"maxvit_t"}
DROP_SEED, DROP_STEP = 7, 1
# Inputs of larger sides are the hash formula's (metadata input = hash), not stored
HASH_INPUT_ABOVE = 128

# arch, input side (the smallest each takes, or a small one)
CASES = [("vgg11", 32), ("vgg11_bn", 32), ("alexnet", 63), ("squeezenet1_0", 32),
         ("squeezenet1_1", 32), ("shufflenet_v2_x0_5", 96),
         ("densenet121", 128), ("convnext_tiny", 32),
         ("vgg13", 32), ("vgg16", 32), ("vgg19", 32), ("vgg13_bn", 32), ("vgg16_bn", 32),
         ("vgg19_bn", 32), ("shufflenet_v2_x1_0", 96), ("mobilenet_v3_small", 64),
         ("regnet_y_400mf", 96), ("mnasnet0_5", 96), ("googlenet", 64), ("inception_v3", 299),
         ("efficientnet_b5", 64),
         ("vit_b_16", 32), ("vit_b_32", 64), ("swin_t", 64), ("swin_s", 64), ("swin_b", 64),
         ("swin_v2_t", 64), ("swin_v2_s", 64), ("swin_v2_b", 64),
         # 304 M to 632 M parameters (tests' label zoo_golden_heavy): 2 x 2 patches each
         ("vit_l_16", 32), ("vit_l_32", 64), ("vit_h_14", 28),
         # torchvision 0.15 and later only (run this script with one): the smallest input
         ("maxvit_t", 224)]
# Architectures built with stochastic depth 0 (its mask is the conformance suite's; torchvision
# draws it from torch's global generator) and their dropout at 0 too; their golden says
# no_dropout = 1 and the C test builds them so. The Swin and MaxViT builders fix
# stochastic_depth_prob themselves: their StochasticDepth layers are set to 0 after building.
NO_SDEPTH = {"convnext_tiny": {"stochastic_depth_prob": 0.0},
             "efficientnet_b5": {"stochastic_depth_prob": 0.0},
             "swin_t": {}, "swin_s": {}, "swin_b": {}, "swin_v2_t": {}, "swin_v2_s": {},
             "swin_v2_b": {}, "maxvit_t": {}}
# The auxiliary classifiers, in the order mgtrain numbers them (its table's), and the weight
# of each one's loss in the loss trained (mgtrain's mgt_arch_info.aux_weight)
AUX = {"inception_v3": (["AuxLogits"], 0.4), "googlenet": (["aux1", "aux2"], 0.3)}
# The transformers step with AdamW, the optimizer of their recipe
ADAMW = {"lr": 1e-3, "weight_decay": 0.05}


def is_transformer(arch):
    return arch.startswith("vit_") or arch.startswith("swin_") or arch.startswith("maxvit_")

# ---- the dropout mask ----

M32 = 0xFFFFFFFF


def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 over numpy uint64 arrays holding 32-bit words."""
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(M32)
        hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(M32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + np.uint64(0x9E3779B9)) & np.uint64(M32)
        k1 = (k1 + np.uint64(0xBB67AE85)) & np.uint64(M32)
    return c0, c1, c2, c3


def dropout_keep(n, per_image, p, stream, seed=DROP_SEED, step=DROP_STEP, sample0=0, stride=1):
    blocks = (per_image + 3) // 4
    keep = np.zeros((n, blocks * 4), dtype=bool)
    thr = math.ceil(p * 16777216.0)
    k0 = np.uint64(seed & M32)
    k1 = np.uint64(((seed >> 32) ^ ((stream * 0x9E3779B9) & M32)) & M32)
    for i in range(n):
        g = sample0 + i * stride
        b = np.arange(blocks, dtype=np.uint64)
        c1 = np.full(blocks, step & M32, dtype=np.uint64)
        c2 = np.full(blocks, g & M32, dtype=np.uint64)
        c3 = np.full(blocks, ((g >> 32) & 0xFFFFFF) | (6 << 24), dtype=np.uint64)
        w = philox(b, c1, c2, c3, k0, k1)
        words = np.stack(w, axis=1).reshape(-1)
        keep[i] = (words >> np.uint64(8)) >= np.uint64(thr)
    return torch.from_numpy(keep[:, :per_image])


class PhiloxDropout(torch.nn.Module):
    def __init__(self, p, stream):
        super().__init__()
        self.p, self.stream = p, stream

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        n = x.shape[0]
        keep = dropout_keep(n, x[0].numel(), self.p, self.stream).reshape(x.shape)
        return x * keep.to(x.dtype) * (1.0 / (1.0 - self.p))


def replace_dropout(model):
    """Every nn.Dropout, in construction order (the order mgtrain numbers its streams)."""
    stream = [0]

    def walk(mod):
        for name, child in mod.named_children():
            if isinstance(child, torch.nn.Dropout):
                setattr(mod, name, PhiloxDropout(child.p, stream[0]))
                stream[0] += 1
            else:
                walk(child)
    walk(model)


# ---- weights by formula ----

def weights(model):
    """Every tensor v = (u - 0.5) * scale + shift (u = hash_uniform(name)), in float64, rounded
    to float32: conv and linear weights scale sqrt(12) * sqrt(2 / fan_in), their biases 0.2;
    BN weight 1 + 0.4 (u - .5), bias 0.2 (u - .5), running_mean 0.2 (u - .5), running_var
    1 + 0.5 (u - .5), num_batches_tracked 0."""
    for name, t in model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            t.zero_()
            continue
        if t.dtype == torch.int64:  # relative_position_index: the definition's own
            continue
        u = hash_uniform(name, t.numel())
        if name.endswith("running_var"):
            scale, shift = 0.5, 1.0
        elif name.endswith("running_mean"):
            scale, shift = 0.2, 0.0
        elif t.dim() >= 2:
            fan_in = t[0].numel()
            scale, shift = math.sqrt(12.0) * math.sqrt(2.0 / fan_in), 0.0
        elif name.endswith(".bias"):
            scale, shift = 0.2, 0.0
        else:  # a BN weight
            scale, shift = 0.4, 1.0
        t.copy_(((u - 0.5) * scale + shift).to(torch.float32).reshape(t.shape))


def summarise(prefix, tensors):
    out = []
    for k, v in tensors.items():
        flat = v.reshape(-1)
        if k.endswith("relative_position_index"):  # a constant of the definition
            continue
        if flat.dtype == torch.int64:
            out.append((prefix + k, flat.clone().reshape(v.shape)))
            continue
        out.append((prefix + k + ".norm", f32(flat.double().norm().reshape(1))))
        out.append((prefix + k + ".samples", f32(flat[sample_index(k, flat.numel())])))
    return out


def train_loss(model, arch, x, labels, smoothing=SMOOTHING):
    """A training forward of model (in training mode) and its loss: the main cross-entropy
    plus AUX's weight times each auxiliary classifier's (their outputs caught by hooks, in
    mgtrain's order). Returns the logits, the loss and the auxiliary losses."""
    aux_names, aux_weight = AUX.get(arch, ([], 0.0))
    aux_out = {}
    hooks = [getattr(model, a).register_forward_hook(
        lambda mod, i, o, a=a: aux_out.__setitem__(a, o)) for a in aux_names]
    out = model(x)
    for h in hooks:
        h.remove()
    logits = out[0] if aux_names else out
    loss = F.cross_entropy(logits, labels, label_smoothing=smoothing)
    aux_losses = [F.cross_entropy(aux_out[a], labels, label_smoothing=smoothing)
                  for a in aux_names]
    for a in aux_losses:
        loss = loss + aux_weight * a
    return logits, loss, aux_losses


def build(arch, size):
    """torchvision's arch as the golden has it: formula weights, mgtrain's dropout masks (or
    stochastic depth and dropout at 0 for NO_SDEPTH); a ViT made for the input side (its
    image_size argument)"""
    kw = dict(NO_SDEPTH.get(arch, {}))
    if arch.startswith("vit_"):
        kw["image_size"] = size
    model = torchvision.models.__dict__[arch](num_classes=CLASSES, **kw)
    if arch in NO_SDEPTH:
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout) or isinstance(m, torchvision.ops.StochasticDepth):
                m.p = 0.0
    weights(model)
    replace_dropout(model)
    return model


def own_train_error(model, arch, x, labels):
    """The tolerance of the training forward's values (logits, loss, BN running statistics):
    TOL_FWD, or 3 times PyTorch's own float32 error on them where that is larger (the rule of
    check_torch_load.py's gradients): with formula weights a BN over few values per channel
    can leave float32 itself short of TOL_FWD. Runs model itself in float32, then converts it
    to float64 in place and runs it again (no copies: a ViT-H is 2.5 GB in float32); the
    buffers a training forward moves (BN running statistics, num_batches_tracked) are put back
    after each run, so model is left as it was, in float64."""
    saved = {n: b.detach().clone() for n, b in model.named_buffers()}

    def run():
        out = train_loss(model, arch, x.to(next(model.parameters()).dtype), labels)
        stats = {n: b.detach().clone() for n, b in model.named_buffers()
                 if n.endswith("running_mean") or n.endswith("running_var")}
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
        return (out[0].detach(), out[1].detach()), stats
    model.float().train()
    l32, s32 = run()
    model.double().train()
    l64, s64 = run()

    def rel(a, b):
        a, b = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
        return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)
    own = max(rel(l32[0], l64[0]), rel(l32[1], l64[1]))
    for n in s64:
        own = max(own, rel(s32[n], s64[n]))
    return max(TOL_FWD, 3 * own)


def case(arch, size):
    model = build(arch, size)
    gen = torch.Generator().manual_seed(1212)
    batch = 1 if arch in ONE_IMAGE else BATCH
    x = torch.randn(batch, 3, size, size, generator=gen)
    labels = torch.randint(0, CLASSES, (batch,), generator=gen)
    if size > HASH_INPUT_ABOVE:
        # uniform with variance 1, by the hash test_zoo recomputes: not megabytes in the file
        x = ((hash_uniform("input", x.numel()) - 0.5) * math.sqrt(12.0)).to(torch.float32) \
            .reshape(x.shape)
    tol_train = own_train_error(model, arch, x, labels)
    m64 = model  # float64 now
    m64.eval()
    with torch.no_grad():
        eval_logits = f32(m64(x.double()))
    m64.train()
    logits, loss, aux_losses = train_loss(m64, arch, x.double(), labels)
    loss.backward()
    # One optimizer step, taken parameter by parameter (an optimizer of its own each: from a
    # zero state the step of one tensor depends on its own gradient alone, so this is the
    # whole model's step value for value), each gradient summarised and freed as its step is
    # taken: a float64 ViT-H's AdamW state alone would be 10 GB, and its gradients 5 GB more.
    grad_summary = []
    for name, p in m64.named_parameters():
        grad_summary += summarise("grad.", {name: f32(p.grad)})
        if is_transformer(arch):
            opt = torch.optim.AdamW([p], **ADAMW)
        else:
            opt = torch.optim.SGD([p], lr=LR, momentum=MOMENTUM, weight_decay=WD)
        opt.step()
        del opt
        p.grad = None
    g = [("labels", labels.to(torch.int32)), ("eval_logits", eval_logits),
         ("step1.logits", f32(logits)), ("step1.loss", f32(loss.reshape(1)))]
    aux_weight = AUX.get(arch, ([], 0.0))[1]
    if aux_losses:
        g.append(("step1.aux_loss", f32(torch.stack(aux_losses).detach())))
    if size <= HASH_INPUT_ABOVE:
        g.insert(0, ("input", x))
    g += grad_summary
    for name, t in m64.state_dict().items():
        g += summarise("step1.", {name: t.detach().clone() if t.dtype == torch.int64 else f32(t)})
    tag = "%s_3x%dx%d" % (arch, size, size)
    meta = {"arch": arch, "classes": str(CLASSES), "in_channels": "3", "image_size": str(size),
            "batch": str(batch), "lr": repr(LR), "momentum": repr(MOMENTUM),
            "weight_decay": repr(WD), "label_smoothing": repr(SMOOTHING),
            "torchvision": torchvision.__version__, "torch": torch.__version__,
            "no_dropout": "1" if arch in NO_SDEPTH else "0", "aux_weight": repr(aux_weight),
            "input": "hash" if size > HASH_INPUT_ABOVE else "stored",
            "tol_train": "%.3g" % tol_train,
            "optimizer": "adamw" if is_transformer(arch) else "sgd"}
    if is_transformer(arch):
        meta["lr"], meta["weight_decay"] = repr(ADAMW["lr"]), repr(ADAMW["weight_decay"])
    n = save_safetensors(os.path.join(OUT, tag + ".golden.safetensors"), g, meta)
    print("%s: loss %.6f, %d bytes" % (tag, float(loss), n), flush=True)


def main():
    torch.set_num_threads(2)
    os.makedirs(OUT, exist_ok=True)
    want = sys.argv[1:]
    for arch, size in CASES:
        if not want or arch in want:
            case(arch, size)


if __name__ == "__main__":
    main()
