#!/usr/bin/python3
"""Converts a PyTorch weights file (torch.save: the zip format, or the legacy pickle) into the
safetensors file that mgtrain's --pretrained and --resume read.

    python3 scripts/pth_to_safetensors.py IN.pth OUT.safetensors [--key NAME] [--trust]

IN may hold a state_dict (torchvision's published weights, `torch.save(model.state_dict())`),
a training checkpoint that holds one under "model" (torchvision's references' checkpoint.pth),
"state_dict" or "model_state_dict" (or the one --key names), or, with --trust, a whole
pickled nn.Module. DistributedDataParallel's "module." prefix is taken off the names.
Floating-point tensors are written as float32, integer ones (BN num_batches_tracked) as int64,
under torchvision's names; the metadata says "format": "pt" and where they came from. The
references' "model_ema" weights, when present, are written as model_ema.* (mgtrain's names).

The file is read with torch.load(weights_only=True), which runs no code from it; a file that
holds other Python objects (the references' argparse namespace, a pickled module) is refused
unless --trust says its source is trusted. Needs PyTorch (Debian: python3-torch); writes
through a temporary file and a rename."""
import argparse
import json
import os
import struct
import sys

try:
    import torch
except ImportError:
    sys.exit("pth_to_safetensors: PyTorch is not installed (Debian: apt-get install python3-torch; "
             "or pip install torch)")

DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def load(path, trust):
    try:
        return torch.load(path, map_location="cpu", weights_only=not trust)
    except TypeError:  # a PyTorch before 1.13 has no weights_only
        if not trust:
            sys.exit("pth_to_safetensors: this PyTorch (%s) cannot load without running the "
                     "file's pickle code; rerun with --trust if you trust %s" % (torch.__version__, path))
        return torch.load(path, map_location="cpu")
    except Exception as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not trust and "Weights only load failed" in str(e):  # other Python objects
            sys.exit("pth_to_safetensors: %s holds Python objects besides tensors; rerun with "
                     "--trust if you trust its source (%s)" % (path, text))
        sys.exit("pth_to_safetensors: %s: torch.load failed: %s" % (path, text))


def state_dict_of(obj, key):
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict(), "a pickled module"
    if not isinstance(obj, dict):
        sys.exit("pth_to_safetensors: the file holds a %s, not a state_dict" % type(obj).__name__)
    for k in ([key] if key else ["model", "state_dict", "model_state_dict"]):
        if k in obj and isinstance(obj[k], (dict, torch.nn.Module)):
            inner = obj[k].state_dict() if isinstance(obj[k], torch.nn.Module) else obj[k]
            return inner, "its %r entry" % k
    if key:
        sys.exit("pth_to_safetensors: no %r in the file (its keys: %s)" % (key, ", ".join(map(str, obj))))
    if all(isinstance(v, torch.Tensor) for v in obj.values()):
        return obj, "a state_dict"
    sys.exit("pth_to_safetensors: no state_dict found (keys: %s); name it with --key"
             % ", ".join(map(str, obj)))


def strip_module(sd):
    if sd and all(k.startswith("module.") for k in sd):
        return {k[len("module."):]: v for k, v in sd.items()}
    return sd


def tensor_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.is_floating_point():
        t = t.to(torch.float32)
    elif t.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8, torch.int64):
        t = t.to(torch.int64)
    else:
        sys.exit("pth_to_safetensors: a tensor of dtype %s cannot be written" % t.dtype)
    return DTYPES[t.dtype], list(t.shape), t.numpy().tobytes()


def write(path, tensors, metadata):
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        dtype, shape, data = tensor_bytes(t)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--key", help="the entry of a checkpoint dict that holds the state_dict")
    ap.add_argument("--trust", action="store_true",
                    help="allow pickled Python objects (runs code from the file)")
    a = ap.parse_args()
    obj = load(a.input, a.trust)
    sd, where = state_dict_of(obj, a.key)
    sd = strip_module(sd)
    tensors = [(k, v) for k, v in sd.items() if isinstance(v, torch.Tensor)]
    if isinstance(obj, dict) and not a.key and "model_ema" in obj and isinstance(obj["model_ema"], dict):
        ema = strip_module(obj["model_ema"])
        tensors += [("model_ema." + k, v) for k, v in ema.items()
                    if isinstance(v, torch.Tensor) and k != "n_averaged"]
    if not tensors:
        sys.exit("pth_to_safetensors: %s holds no tensors" % a.input)
    meta = {"format": "pt", "source": os.path.basename(a.input), "converted_by": "pth_to_safetensors.py",
            "torch_version": torch.__version__}
    write(a.output, tensors, meta)
    print("pth_to_safetensors: %s -> %s: %d tensors from %s" % (a.input, a.output, len(tensors), where))


if __name__ == "__main__":
    main()
