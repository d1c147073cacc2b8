#!/usr/bin/python3
"""torchvision-written weights for test_zoo's `pretrained` case (the --pretrained direction):
torchvision 0.14's ARCH (10 classes, PyTorch's own init under torch.manual_seed(12)), one
training forward without gradients so the BN running statistics are not 0 and 1, then its
state_dict into WEIGHTS (safetensors, as a user's conversion of torch.save would give) and an
input of 2 images with the eval logits (float64) into CHECK.

With --verify, the other way: WEIGHTS is what mgtrain wrote after loading those; it must load
into torchvision's ARCH with strict=True and give CHECK's eval logits (exit 1 where not).

scripts/check_zoo_strict.py runs both directions for every architecture in one process.

Usage: scripts/write_torch_weights.py ARCH SIZE WEIGHTS CHECK
       scripts/write_torch_weights.py --verify ARCH WEIGHTS CHECK"""
import contextlib
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_model_goldens import save_safetensors, f32  # noqa: E402
from goldens_common import fast_double_depthwise  # noqa: E402


INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
                  "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_")


@contextlib.contextmanager
def no_init():
    """torch.nn.init's functions leave their tensor as it is: for a model whose every parameter
    and buffer a strict load then writes (swin_v2_t's own initialisation took 2.1 s)"""
    saved = {f: getattr(torch.nn.init, f) for f in INIT_FUNCTIONS}
    for f in INIT_FUNCTIONS:
        setattr(torch.nn.init, f, lambda t, *args, **kwargs: t)
    try:
        yield
    finally:
        for f, fn in saved.items():
            setattr(torch.nn.init, f, fn)


def build(arch, size, init=True):
    """torchvision's ARCH at 10 classes; a ViT made for the input side (its image_size). Without
    init, its parameters are left as they come (a strict load follows): GoogLeNet's and
    Inception V3's scipy initialisation alone took 0.7 and 1.8 s."""
    kw = {"image_size": size} if arch.startswith("vit_") else {}
    if not init and arch in ("googlenet", "inception_v3"):
        kw["init_weights"] = False
    with contextlib.nullcontext() if init else no_init():
        model = torchvision.models.__dict__[arch](num_classes=10, **kw)
    return fast_double_depthwise(model)


def verify(arch, wpath, cpath):
    import check_torch_load as ctl
    weights, _ = ctl.load_safetensors(wpath)
    check, _ = ctl.load_safetensors(cpath)
    model = build(arch, check["input"].shape[-1], init=False)
    model.load_state_dict(ctl.with_metadata(model, weights), strict=True)
    model = model.double().eval()
    with torch.no_grad():
        got = model(check["input"].double())
    want = check["eval_logits"].double()
    err = float((got - want).abs().max()) / float(want.abs().max())
    print("write_torch_weights: %s: mgtrain's file loads with strict=True, logits rel %.3g"
          % (arch, err))
    return 0 if err <= 2e-5 else 1


def write(arch, size, wpath, cpath):
    torch.manual_seed(12)
    model = build(arch, size)
    if arch.startswith("vit_"):  # torchvision zeroes the head: logits of 0 would check nothing
        with torch.no_grad():
            model.heads.head.weight.normal_(std=0.02)
            model.class_token.normal_(std=0.02)
    gen = torch.Generator().manual_seed(34)
    x = torch.randn(2, 3, size, size, generator=gen)
    with torch.no_grad():
        model.train()
        model(torch.randn(4, 3, size, size, generator=gen) * 1.5 + 0.3)
        model.eval()
        logits = model.double()(x.double())
    sd = {k: (v if v.dtype == torch.int64 else f32(v)) for k, v in model.state_dict().items()}
    save_safetensors(wpath, list(sd.items()), {"arch": arch})
    save_safetensors(cpath, [("input", x), ("eval_logits", f32(logits))], {"arch": arch})


def main():
    if sys.argv[1] == "--verify":
        return verify(sys.argv[2], sys.argv[3], sys.argv[4])
    torch.set_num_threads(2)
    write(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
    return 0


if __name__ == "__main__":
    sys.exit(main())
