# What the golden writers and the PyTorch checks share: the tests' array format ("mgt-golden 1",
# read by tests/support/golden.c) and reading a safetensors file (mgtrain's weights and
# checkpoints) into torch tensors.
import json
import os
import struct

import torch

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
