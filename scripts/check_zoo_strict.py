#!/usr/bin/python3
"""Both directions of torchvision's state_dict for every architecture, in one PyTorch process
(test_zoo's `strict` case): per architecture, torchvision 0.14's model (its own init, BN
statistics moved by one training forward) is written with its float64 eval logits
(write_torch_weights.write); `TEST_ZOO strict-one` loads the file as --pretrained does, must
give those logits, and writes mgtrain's weights; those must load into torchvision's model with
strict=True and give the same logits (write_torch_weights.verify). One line per architecture;
exit 1 naming every architecture that failed either way.

Usage: scripts/check_zoo_strict.py TEST_ZOO ARCH:SIZE [ARCH:SIZE ...]"""
import os
import subprocess
import sys
import tempfile
import time

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import write_torch_weights as wtw  # noqa: E402


def main():
    exe, cases = sys.argv[1], [(a.split(":")[0], int(a.split(":")[1])) for a in sys.argv[2:]]
    archs = [a for a, _ in cases]
    torch.set_num_threads(2)
    failed = []
    with tempfile.TemporaryDirectory(prefix="mgt-zoo-strict-") as tmp:
        w, c, o = (os.path.join(tmp, n) for n in ("torch.safetensors", "check.safetensors",
                                                  "mgtrain.safetensors"))
        for arch, size in cases:
            if arch not in torchvision.models.__dict__:
                print("zoo strict: %s: skipped: torchvision %s lacks it (run this script under a "
                      "newer one, e.g. a venv's python, to check it)" % (arch, torchvision.__version__),
                      flush=True)
                continue
            t0 = time.monotonic()
            wtw.write(arch, size, w, c)
            r = subprocess.run([exe, "strict-one", arch, str(size), w, c, o],
                               capture_output=True, text=True)
            os.unlink(w)
            into = next((ln[len("strict-one: "):] for ln in r.stdout.splitlines()
                         if ln.startswith("strict-one: ")), "")
            if r.returncode != 0:
                print("zoo strict: %s: torchvision -> mgtrain FAILED (exit %d): %s%s"
                      % (arch, r.returncode, into, (r.stdout + r.stderr).strip()[-600:]), flush=True)
                failed.append(arch)
                continue
            back = wtw.verify(arch, o, c)
            os.unlink(o)
            print("zoo strict: %s: %s; %.1f s" % (arch, into, time.monotonic() - t0), flush=True)
            if back != 0:
                failed.append(arch)
    if failed:
        print("zoo strict: FAILED: %s" % " ".join(failed))
        return 1
    print("zoo strict: all %d architectures load both ways with strict=True" % len(archs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
