# What the golden writers and the PyTorch checks share: the tests' array format ("mgt-golden 1",
# read by tests/support/golden.c), reading a safetensors file (mgtrain's weights and
# checkpoints) into torch tensors, and a float64 depthwise convolution fast enough to check with.
import json
import os
import struct
import types

import torch
import torch.nn.functional as F

ST_DTYPES = {"F32": torch.float32, "I64": torch.int64, "I32": torch.int32}


def write(out_dir, name, arrays):
    """Writes out_dir/name.bin: a text line "mgt-golden 1 <arrays>\\n", then per (key, values)
    a text line "<key> <f32|i32> <count>\\n" and the values, raw little-endian; values all ints
    (or bools) are i32, else f32. Returns the file's size."""
    path = os.path.join(out_dir, name + ".bin")
    with open(path, "wb") as f:
        f.write(b"mgt-golden 1 %d\n" % len(arrays))
        for key, val in arrays:
            if isinstance(val, torch.Tensor):
                val = val.detach().flatten().tolist()
            is_int = all(isinstance(v, (int, bool)) for v in val)
            fmt = "<%d%s" % (len(val), "i" if is_int else "f")
            f.write(b"%s %s %d\n" % (key.encode(), b"i32" if is_int else b"f32", len(val)))
            f.write(struct.pack(fmt, *[int(v) if is_int else float(v) for v in val]))
    return os.path.getsize(path)


def load_safetensors(path):
    """The file's tensors by name (copies, so they outlive the file's bytes) and its header's
    __metadata__ (an empty dict without one)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, h in header.items():
        b, e = h["data_offsets"]
        dtype = ST_DTYPES[h["dtype"]]
        t = torch.frombuffer(bytearray(data[base + b:base + e]), dtype=dtype) if e > b else \
            torch.zeros(0, dtype=dtype)
        out[name] = t.reshape(h["shape"]).clone()
    return out, meta


def _depthwise_forward(conv, x):
    """conv (groups == in_channels) on x: PyTorch's own in float32; in float64 as an unfold and
    a product summed over the window, which is the same sum (to 1e-15 of the largest logit)"""
    if x.dtype != torch.float64:
        return conv._conv_forward(x, conv.weight, conv.bias)
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = (conv.kernel_size, conv.stride, conv.padding,
                                              conv.dilation)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    mult = conv.out_channels // c
    cols = F.unfold(x, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))
    y = (cols.view(n, c, 1, kh * kw, oh * ow) * conv.weight.view(1, c, mult, kh * kw, 1)).sum(3)
    y = y.reshape(n, conv.out_channels, oh, ow)
    return y if conv.bias is None else y + conv.bias.view(1, -1, 1, 1)


def fast_double_depthwise(model):
    """model with its depthwise convolutions' float64 forward replaced (_depthwise_forward):
    PyTorch 1.13's own float64 depthwise path took 6.7 s for efficientnet_b5's forward at 64
    pixels, batch 2, and 0.4 s this way (2026-12-07, AMD EPYC Zen 3): most of the time the
    strict-load checks of the MobileNets, EfficientNets, MNASNets, RegNets and ConvNeXts took.
    (Its grouped convolutions with several channels a group run at the speed of its others.)
    Autograd differentiates the replacement as it is; a deepcopy keeps it."""
    for m in model.modules():
        if (isinstance(m, torch.nn.Conv2d) and m.groups > 1 and m.groups == m.in_channels
                and m.padding_mode == "zeros" and not isinstance(m.padding, str)):
            m.forward = types.MethodType(_depthwise_forward, m)
    return model
