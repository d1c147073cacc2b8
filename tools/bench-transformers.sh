#!/usr/bin/env bash
# The transformers' speed table (docs/benchmarks.md): vit_b_16 and swin_t, the training step at
# batch 8, 3x224x224, 2 threads, fp32 and --amp bf16, mgtrain (one mock device, bench
# --op-profile) against PyTorch from the venv /tmp/pt2 ($PYTHON) on jemalloc with channels_last
# and its autocast for bf16; GFLOP/s from mgtrain's forward MACs and the fraction of the sgemm
# peak (--sgemm-peak, 185 GFLOP/s: AMD EPYC Zen 4, 2 threads). Each run waits until the 1-minute
# load average is below 1 (up to 10 minutes): numbers from a busy machine are not the table's.
# Extra arguments go to tools/compare-pytorch.sh (e.g. --quick, --rounds 5, --json FILE).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=${PYTHON:-/tmp/pt2/bin/python}
if ! "$py" -c 'import torch, torchvision' 2>/dev/null; then
    echo "bench-transformers: $py has no torch and torchvision (the PyTorch to compare with:" \
         "a venv's python, PYTHON=...)" >&2
    exit 2
fi
exec "$here/compare-pytorch.sh" --parts transformers --python "$py" --channels-last \
    --precisions f32,bf16 --rounds 3 --wait-quiet 1.0 --wait-max 600 "$@"
