#!/usr/bin/env python3
"""Runs an exported model in ONNX Runtime and compares its logits with mgtrain's (the test
export.runtime; onnxruntime from PyPI in a venv of one's own, named by MGT_ORT_PYTHON).

usage: check_onnx_runtime.py MODEL.onnx INPUT.f32 LOGITS.f32 N C H W K TOLERANCE

INPUT.f32 holds float32 [N, C, H, W], LOGITS.f32 mgtrain's float32 [N, K] for it (eval mode,
the same weights). The largest difference must be at most TOLERANCE times the largest
|logit| (the two add in other orders: float32 rounding, not a bound on accuracy). Prints the
figures; exits 1 when they differ.
"""
import sys

import numpy as np
import onnxruntime as ort


def main():
    path, xin, yin = sys.argv[1:4]
    n, c, h, w, k = (int(v) for v in sys.argv[4:9])
    tol = float(sys.argv[9])
    x = np.fromfile(xin, dtype=np.float32).reshape(n, c, h, w)
    want = np.fromfile(yin, dtype=np.float32).reshape(n, k)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    got = sess.run(["logits"], {"input": x})[0]
    # the batch is dynamic: one image alone gives its row
    one = sess.run(["logits"], {"input": x[:1]})[0]
    if not (np.isfinite(want).all() and np.isfinite(got).all() and np.isfinite(one).all()):
        print(f"{path}: logits that are not finite (mgtrain's {want.ravel()[:4]}...)")
        sys.exit(1)
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    err1 = float(np.abs(one[0] - want[0]).max())
    # the check has teeth only where the logits depend on the input: the images' logits must
    # differ by ten times the tolerance at least
    spread = float(np.abs(want[0] - want[-1]).max()) if n > 1 else scale
    print(f"{path}: onnxruntime {ort.__version__}: batch {n} max |diff| {err:.3g}, batch 1 "
          f"{err1:.3g}, largest |logit| {scale:.3g} (tolerance {tol:g} of it), the images' "
          f"logits {spread:.3g} apart")
    if got.shape != want.shape or max(err, err1) > tol * max(scale, 1e-30):
        sys.exit(1)
    if spread < 10 * tol * scale:
        print(f"{path}: the logits hardly depend on the input: a check without teeth")
        sys.exit(1)


if __name__ == "__main__":
    main()
