#!/usr/bin/env bash
# Installs the Debian packages mgtrain needs to build, test and train; silent when all are present.
#   --test  also what the test suite calls (scripts/test.sh passes it): Debian's PyTorch and
#           torchvision, the reference of the interop tests (zoo.strict, models.torch_load, the
#           checkpoint's strict load), protobuf and onnx for the report and export checks;
#           training itself needs none of them
#   --list  print the packages that would be checked, one a line, and exit
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  clang-format-14       # the layout check (tools/check-format.sh)
  libdnnl-dev           # oneDNN: convolutions and gemm on the CPU mock devices
  libstb-dev            # image decoding (stb_image): PNG, BMP, GIF, TGA, PNM
  libturbojpeg0-dev     # JPEG decode and encode (libjpeg-turbo's TurboJPEG API)
  libjpeg62-turbo-dev   # JPEG region decodes at a DCT scale (libjpeg-turbo's libjpeg API)
  libcjson-dev          # JSON: safetensors headers, --log, bench --json
  libcmocka-dev         # test assertions
  zlib1g-dev            # gzip-compressed IDX files (Fashion-MNIST import), pack checksums
  libprotobuf-c-dev     # protocol buffers in C: TensorBoard event files, ONNX export
  protobuf-c-compiler   # protoc-c: C from those .proto files at build time
  libisal-dev           # CRC-32C (ISA-L's crc32_iscsi) of TensorBoard's event records
  libonnx-dev           # onnx.proto, the ONNX format's own definition (mgtrain export)
  dataset-fashion-mnist # the bundled real data set
  libopenmpi-dev        # multi-node runs: one process per node on Open MPI (-DMGT_MPI)
  openmpi-bin           # mpirun, for those runs and their tests
)
test_packages=(
  python3-torch         # PyTorch 1.13: the interop tests load mgtrain's files into it
  python3-torchvision   # torchvision 0.14: its models and weights, both ways
  python3-protobuf      # the event files decoded by Google's protobuf (report.tensorboard)
  python3-onnx          # onnx.checker on every exported architecture (export.check_*)
  # Debian's PyTorch calls the system's BLAS (libblas.so.3), the reference implementation
  # unless another is installed: OpenBLAS (the OpenMP build, PyTorch's threading) takes its
  # place and runs the float64 checks' matrix products about 6 times faster
  libopenblas0-openmp
  libjemalloc2          # the plain build's tests' allocator (tests/CMakeLists.txt says why)
)

list=false
for arg in "$@"; do
  case $arg in
  --test) packages+=("${test_packages[@]}") ;;
  --list) list=true ;;
  *) echo "setup: unknown option '$arg' (--test, --list)" >&2; exit 2 ;;
  esac
done
if $list; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}; run this script as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
