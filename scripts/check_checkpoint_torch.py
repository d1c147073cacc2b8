# Loads an mgtrain training checkpoint the way a PyTorch user would: its tensors minus the
# optimizer's state ("optimizer.*", mgtrain's own) and the EMA model ("model_ema.*", from
# --model-ema) go into the architecture's model with load_state_dict(strict=True), and the
# model runs a forward; the EMA tensors, when there, load the same way into a second model
# (the references' model_ema.module). Called by
# tests/test_checkpoint.c (test_checkpoint_loads_in_pytorch).
#
# usage: /usr/bin/python3 scripts/check_checkpoint_torch.py CHECKPOINT.safetensors
# Exit status 0: it loads and runs; 1: it does not (printed); 77: PyTorch is missing.
import os
import sys

try:
    import torch
except ImportError:
    print("check_checkpoint_torch: PyTorch is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_load as ctl  # noqa: E402


def main():
    tensors, meta = ctl.load_safetensors(sys.argv[1])
    if meta.get("format") != "pt":
        print("check_checkpoint_torch: metadata format is %r, not 'pt'" % meta.get("format"))
        return 1
    state = {k: v for k, v in tensors.items()
             if not k.startswith("optimizer.") and not k.startswith("model_ema.")}
    ema = {k[len("model_ema."):]: v for k, v in tensors.items() if k.startswith("model_ema.")}
    arch, classes, cin = meta["arch"], int(meta["classes"]), int(meta["in_channels"])
    size = int(meta["image_size"])
    model, source = ctl.build(arch, classes, cin)
    model.load_state_dict(state, strict=True)
    if ema:
        ctl.build(arch, classes, cin)[0].load_state_dict(ema, strict=True)
        print("check_checkpoint_torch: the EMA model loaded %d tensors with strict=True"
              % len(ema))
    model.eval()
    with torch.no_grad():
        out = model(torch.zeros(2, cin, size, size))
    if tuple(out.shape) != (2, classes) or not bool(torch.isfinite(out).all()):
        print("check_checkpoint_torch: the forward gave %s" % (tuple(out.shape),))
        return 1
    print("check_checkpoint_torch: %s (%s) loaded %d tensors with strict=True, epoch %s"
          % (arch, source, len(state), meta.get("epoch")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
