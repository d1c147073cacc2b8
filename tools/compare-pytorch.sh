#!/usr/bin/env bash
# Runs mgtrain and PyTorch side by side on this machine (training step, 2-device scaling, data loading) and prints medians and ratios; PyTorch is optional.
#
# usage: tools/compare-pytorch.sh [--quick] [--parts train,scale,zoo,data] [--rounds N] [--python PATH]
#                                 [--precisions f32,bf16] [--channels-last] [--no-glibc]
#                                 [--mgtrain PATH] [--wait-quiet LOAD] [--json FILE] ...
# (--help lists every option.) PyTorch comes from the system Python by default (Debian's
# python3-torch lives in /usr/bin/python3's dist-packages; a pyenv or venv python3 earlier
# in PATH would not see it); set PYTHON to use another. Where Python or PyTorch is missing
# the script says so and exits 0: the comparison is optional. Where torchvision is missing,
# resnet18 and the data part are skipped. mgtrain defaults to build/mgtrain ($MGTRAIN).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -z "${PYTHON:-}" ]; then
    if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=$(command -v python3 || true); fi
fi
if [ -z "$PYTHON" ] || ! "$PYTHON" -c 'import sys' 2>/dev/null; then
    echo "compare-pytorch: no python3 found; the PyTorch comparison is optional, nothing to compare."
    exit 0
fi
exec "$PYTHON" "$here/pytorch/compare.py" "$@"
