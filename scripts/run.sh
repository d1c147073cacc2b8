#!/usr/bin/env bash
# Sets up, builds and runs the main job: lists the devices (CPU mock devices where no GPU is found).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGT_CUDA=AUTO >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
./build/mgtrain devices "$@"
