#!/usr/bin/env python3
"""Checks ONNX files that `mgtrain export --onnx` wrote against the checkpoints they came from
(the test export.check; Debian's python3-onnx 1.12, which has a checker and no evaluator).

usage: check_onnx.py MODEL.onnx:CHECKPOINT.safetensors [...]

For each: onnx.checker.check_model (the graph, every node against its operator's schema at
the stated opset) and strict shape inference through the whole graph (check_model's
full_check), opset
17, one input "input" [batch, C, H, W] and one output "logits" [batch, classes] with batch a
named dimension and the inferred logits shape equal to the declared one, class names in the
metadata, no Dropout node; every tensor of the checkpoint's state_dict (num_batches_tracked,
the optimizer's and EMA state and the training-only auxiliary classifiers of Inception v3 and
GoogLeNet aside) is an initializer of the same name whose values are
equal to the bit (a convolution's 2-D weight may carry two trailing 1s). Exits non-zero
with a line naming the file and what does not hold.
"""
import json
import struct
import sys
import time

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference


# Inception v3's and GoogLeNet's auxiliary classifiers: training only, left out of the export
AUX_MODULES = ("AuxLogits.", "aux1.", "aux2.")


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": np.float32, "I64": np.int64}[t["dtype"]]
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(buf[base + a:base + b], dtype=dt).reshape(t["shape"])
    return out


def dims(vi):
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


def check(onnx_path, ckpt_path):
    def fail(msg):
        raise SystemExit(f"{onnx_path}: {msg}")

    t0 = time.time()
    model = onnx.load(onnx_path)
    t1 = time.time()
    try:  # full_check's two halves, the inferred model kept: the checker, strict inference
        onnx.checker.check_model(model)
        t2 = time.time()
        inferred = shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as e:  # the checker's own exceptions carry the node
        fail(f"checker: {e}")
    t3 = time.time()
    if [(o.domain, o.version) for o in model.opset_import] != [("", 17)]:
        fail(f"opset {model.opset_import}")
    g = model.graph
    if [i.name for i in g.input] != ["input"] or [o.name for o in g.output] != ["logits"]:
        fail(f"inputs {[i.name for i in g.input]}, outputs {[o.name for o in g.output]}")
    din, dout = dims(g.input[0]), dims(g.output[0])
    if len(din) != 4 or din[0] != "batch" or len(dout) != 2 or dout[0] != "batch":
        fail(f"input {din}, output {dout}: a named batch dimension first")
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.name == "logits" and dims(vi) != dout:
            fail(f"shape inference gives logits {dims(vi)}, declared {dout}")
    meta = {p.key: p.value for p in model.metadata_props}
    names = json.loads(meta.get("class_names", "[]"))
    if len(names) != dout[1]:
        fail(f"{len(names)} class names for {dout[1]} classes")
    node_names = [n.name for n in g.node]
    if len(set(node_names)) != len(node_names):
        fail("node names repeat (ONNX Runtime refuses such a model)")
    if any(n.op_type == "Dropout" for n in g.node):
        fail("a Dropout node is left")
    inits = {t.name: t for t in g.initializer}
    state = read_safetensors(ckpt_path)
    checked = 0
    for name, want in state.items():
        if name.endswith("num_batches_tracked") or name.startswith(("optimizer.", "model_ema.")):
            continue
        if name.startswith(AUX_MODULES):  # not in the inference graph
            if name in inits:
                fail(f"the auxiliary classifier's {name} is exported")
            continue
        if name not in inits:
            fail(f"no initializer {name}")
        got = numpy_helper.to_array(inits[name])
        if got.shape != want.shape:
            if got.shape == want.shape + (1, 1):
                got = got.reshape(want.shape)
            else:
                fail(f"{name}: shape {got.shape}, the checkpoint's {want.shape}")
        if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            fail(f"{name}: values differ from the checkpoint's")
        checked += 1
    t4 = time.time()
    print(f"{onnx_path}: checker passed, {len(g.node)} nodes, {checked} tensors equal to "
          f"{ckpt_path}'s, input {din}, output {dout} (load {t1 - t0:.1f} s, checker "
          f"{t2 - t1:.1f} s, inference {t3 - t2:.1f} s, tensors {t4 - t3:.1f} s)")


def main():
    for arg in sys.argv[1:]:
        o, c = arg.split(":", 1)
        check(o, c)


if __name__ == "__main__":
    main()
