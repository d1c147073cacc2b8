#!/usr/bin/env bash
# Sets up, builds and runs the main job: imports Fashion-MNIST once, then trains a ResNet-20 on
# it for one epoch on every GPU, or on CPU mock devices where there is none. Arguments, when
# given, replace the training flags.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
# both GPU architectures, named: the test command configures the same folder for sm_90 alone
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGT_CUDA=AUTO "-DMGT_CUDA_ARCHITECTURES=80;90" \
  >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
./build/mgtrain import-idx --out data/fashion-mnist
if [ $# -gt 0 ]; then
  exec ./build/mgtrain "$@"
fi
exec ./build/mgtrain --data data/fashion-mnist -a resnet20 --epochs 1 -b 128 --lr 0.1 \
  --lr-schedule cosine --warmup-epochs 0.1 --wd 5e-4 \
  -p 50 --checkpoint-dir data/checkpoints --log data/train.jsonl
