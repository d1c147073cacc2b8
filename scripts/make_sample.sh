#!/usr/bin/env bash
# Makes data/sample, the small real ImageFolder tree committed with the repository: the first 30
# Fashion-MNIST images of each class from Debian's dataset-fashion-mnist, train and val (600 PNGs,
# about 340 KB). The same files every time; run it again after removing data/sample.
set -euo pipefail
cd "$(dirname "$0")/.."
mgtrain=${MGTRAIN:-build/mgtrain}
if [ ! -x "$mgtrain" ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j"$(nproc)" --target mgtrain >/dev/null
fi
exec "$mgtrain" import-idx --per-class 30 --out data/sample -q
