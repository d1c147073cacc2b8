#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: the plain build (with the CUDA backend when the
# toolkit is present), then the address+undefined and thread sanitizer builds.
set -euo pipefail
cd "$(dirname "$0")/.."

# what the tests call too (PyTorch and torchvision for the interop tests); and a test that
# would skip for want of something this setup installs fails instead (tests/support/fixture.h,
# tests/mpi/test_mpi.sh): a fresh clone must not pass its interop tests by skipping them
bash scripts/setup.sh --test
export MGT_TEST_REQUIRE_DEPS=1
jobs=$(nproc)

echo "== layout (.clang-format) =="
bash tools/check-format.sh

echo "== plain build (MGT_CUDA=AUTO) =="
# The CUDA backend for sm_90 (H100, H200) alone, the architecture the tests' CUDA build must
# compile for with 0 warnings; the default build (scripts/run.sh, a user's cmake) also makes
# sm_80's. The kernels have no per-architecture code, and sm_80's machine code took 15 s of the
# build's 52 s of nvcc on 2 cores (AMD EPYC Zen 3, 2026-12-07).
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMGT_CUDA=AUTO -DMGT_CUDA_ARCHITECTURES=90 \
  >build-configure.log ||
  { cat build-configure.log; exit 1; }
grep -E "mgtrain: CUDA backend" build-configure.log || true
cmake --build build -j"$jobs"
# export.check_heavy (label export_heavy: the models of 30 M to 198 M parameters through the
# ONNX checker, about 10 minutes), zoo.strict.heavy (label zoo_strict_heavy: the same
# models' torchvision weights both ways, about 8 minutes) and the goldens of vit_l_16,
# vit_l_32 and vit_h_14 (label zoo_golden_heavy: 304 M to 632 M parameters, gigabytes each)
# are left out; `ctest -L 'export_heavy|zoo_strict_heavy'` and `ctest -j1 -L
# zoo_golden_heavy` run them.
(cd build && ctest --output-on-failure -j"$jobs" -LE 'export_heavy|zoo_strict_heavy|zoo_golden_heavy')

# The sanitizer builds keep Debug's assertions at -O1 (the sanitizers' own advice), not -O0:
# on 2 cores the address build's tests took 430 s instead of about 720, the thread build's 578
# instead of about 730 (AMD EPYC Zen 3, 2026-12-07); the CPU kernels are -O3 in every build.
sanitizer_flags=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1" -DMGT_CUDA=OFF)

echo "== address,undefined sanitizer build =="
cmake -S . -B build-asan "${sanitizer_flags[@]}" -DMGT_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j"$jobs"
# zoo.strict (label zoo_strict) is left out here: its C side is the loader zoo.pretrained runs
# under the sanitizers, and its architectures' weights would add minutes. models.torch_load.*
# run mgtrain's side alone (MGT_TORCH_LOAD_PYTHON=0): the plain build has run PyTorch's
# float64 check of the same models. The zoo_heavy cases (the VGGs' 130 M parameters learning,
# against their goldens and fine-tuned: about 6 minutes under the sanitizers) run only in the
# plain build: their layers are the ones the lighter families run here. So do the 16-bit
# steps of every architecture (zoo_amp: each family minutes under the sanitizers; their kernels'
# 16-bit cases run here in the conformance suite, and zoo.amp.cifar_resnet steps a model).
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  MGT_TORCH_LOAD_PYTHON=0 MGT_EXPORT_PYTHON=0 ctest --output-on-failure -j"$jobs" \
  -LE 'zoo_strict|export_heavy|zoo_heavy|zoo_amp|zoo_golden_heavy')

echo "== thread sanitizer build (device, stream and threading tests) =="
cmake -S . -B build-tsan "${sanitizer_flags[@]}" -DMGT_SANITIZE=thread >/dev/null
# the labels it runs, whole (train.plan's train_plan, which starts no thread, is not among them)
tsan_labels='^(streams|devices|comm|cpu_kernels|data|data_augment|data_pack|train|train_failure|train_survive)$'
# only the executables those tests run: the library and the rest would be built for nothing
cmake --build build-tsan -j"$jobs" --target test_streams test_devices test_comm test_cpu_kernels \
  test_data test_data_augment test_data_pack test_train test_train_failure test_train_survive
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --output-on-failure -j"$jobs" -L "$tsan_labels")
