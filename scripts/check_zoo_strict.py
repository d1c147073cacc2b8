#!/usr/bin/python3
"""Both directions of torchvision's state_dict for every architecture, in one PyTorch process
(test_zoo's `strict` case): per architecture, torchvision 0.14's model (its own init, BN
statistics moved by one training forward) is written with its float64 eval logits
(write_torch_weights.write); `TEST_ZOO strict-one` loads the file as --pretrained does, must
give those logits, and writes mgtrain's weights; those must load into torchvision's model with
strict=True and give the same logits (write_torch_weights.verify). One line per architecture;
exit 1 naming every architecture that failed either way.

Usage: scripts/check_zoo_strict.py TEST_ZOO SIZE ARCH[:SIZE] [ARCH[:SIZE] ...]
(an architecture's own SIZE where SIZE is too small for it: inception_v3's auxiliary classifier
needs 299, maxvit_t 224; vit_h_14's 14-pixel patches take 56). An architecture the Python's
torchvision lacks (maxvit_t before 0.15) is skipped with a line saying so."""
import os
import resource
import subprocess
import sys
import tempfile
import time

# Sleeping, not spinning, OpenMP workers (PyTorch's and, inherited, mgtrain's oneDNN): beside
# other tests on 2 busy cores, spinning ones took 20x the CPU (efficientnet_b1 and
# mobilenet_v2: 65 s of CPU against 3.4 s, 2026-12-06). Read when libgomp loads: before torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torchvision  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import write_torch_weights as wtw  # noqa: E402


def cpu_seconds():
    """user + system time of this process and its finished children"""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main():
    exe, size, archs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    torch.set_num_threads(2)
    failed = []
    with tempfile.TemporaryDirectory(prefix="mgt-zoo-strict-") as tmp:
        w, c, o = (os.path.join(tmp, n) for n in ("torch.safetensors", "check.safetensors",
                                                  "mgtrain.safetensors"))
        for spec in archs:
            arch, _, own = spec.partition(":")
            side = int(own) if own else size
            if arch not in torchvision.models.__dict__:
                print("zoo strict: %s: skipped: torchvision %s lacks it (run this script under a "
                      "newer one, e.g. a venv's python, to check it)" % (arch, torchvision.__version__),
                      flush=True)
                continue
            t0 = time.monotonic()
            cpu0 = cpu_seconds()
            wtw.write(arch, side, w, c)
            r = subprocess.run([exe, "strict-one", arch, str(side), w, c, o],
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
            print("zoo strict: %s at %d: %s; %.1f s (%.1f s of CPU)"
                  % (arch, side, into, time.monotonic() - t0, cpu_seconds() - cpu0), flush=True)
            if back != 0:
                failed.append(arch)
    if failed:
        print("zoo strict: FAILED: %s" % " ".join(failed))
        return 1
    print("zoo strict: all %d architectures load both ways with strict=True" % len(archs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
