#!/usr/bin/env bash
# One command for a GPU machine: builds mgtrain with the CUDA backend and runs the CUDA checks within 450 seconds.
#
#   tools/gpu-check.sh               on the GPU machine, from the repository root
#   tools/gpu-check.sh --fetch-deps  on a Debian 12 machine with apt, beforehand
#
# The GPU machine may have CUDA and the Python wheels' cuDNN/cuBLAS but none of Debian's
# development packages the build needs (oneDNN, cJSON, cmocka, stb, zlib, pkg-config). Where
# they are missing, the script unpacks the .deb files of .gpu-deps/ (made by --fetch-deps;
# git ignores the folder: carry it to the machine) into a private prefix beside the build
# folder and points the build at it; nothing is installed into the system.
# MGT_GPU_CHECK_USE_DEBS=1 takes the carried .debs even where the system has the packages.
# A piece still missing after that (no GPU, no nvcc, no cuDNN or cuBLAS, a package neither
# the system nor .gpu-deps has) stops the script before it configures, with a line naming it.
#
# Steps, each under its own timeout and all under one deadline (420 s, so that a step's kill
# grace and the summary still fit in 450 s): configure, build, cuda_smoke (the backend's
# plumbing, asynchronous and under MGT_CUDA_SYNC=1), the conformance suite (every op, CUDA
# beside the CPU reference), the CUDA training tests (train, models), `mgtrain devices` on
# CUDA, the kernel benchmark, the resnet50 training step in fp32, TF32, bf16 and fp16 on GPU 0,
# then the remaining tests. Test timeouts are the build's
# MGT_TEST_TIMEOUT (each test's TIMEOUT property, which `ctest --timeout` does not
# override). Writes $OUT/gpu-check.log (everything), $OUT/summary.json and, when the
# benchmark ran, $OUT/bench.json; OUT defaults to ./gpu-check-out.
set -u

# libdnnl2 also needs libc6, libgcc-s1, libstdc++6 and libgomp1, which every machine with GCC
# has; the build's -lgomp and omp.h are GCC's own (libgcc-N-dev), which no .deb here replaces,
# and an older libgomp.so.1 on LD_LIBRARY_PATH would shadow the compiler's: libgomp1 stays out.
DEB_PACKAGES="libdnnl-dev libdnnl2 ocl-icd-libopencl1 libcjson-dev libcjson1 libcmocka-dev
libcmocka0 libstb-dev libstb0 zlib1g-dev zlib1g pkgconf pkgconf-bin libpkgconf3"

if [ "${1:-}" = "--fetch-deps" ]; then
    # apt-get download fetches single .deb files into the current folder; no root needed
    # once the package lists exist.
    mkdir -p .gpu-deps && cd .gpu-deps || exit 1
    # shellcheck disable=SC2086
    apt-get download $DEB_PACKAGES || exit 1
    echo "gpu-check: $(find . -name '*.deb' | wc -l) packages in .gpu-deps/ ($(du -sh . | cut -f1));"
    echo "  carry it to the GPU machine (git ignores it)"
    exit 0
fi
if [ $# -gt 0 ]; then
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi

REPO=$(pwd)
OUT=${OUT:-$REPO/gpu-check-out}
mkdir -p "$OUT"
LOG=$OUT/gpu-check.log
: >"$LOG"
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
BUILD=$REPO/build-gpu
START=$(date +%s)
# 450 s in all: the steps end by 420 s; a step killed at the deadline gets 10 s of grace
# (timeout --kill-after), and the summary needs a few more.
DEADLINE=$((START + 420))
TEST_TIMEOUT=100 # each test's TIMEOUT (MGT_TEST_TIMEOUT), under the steps' own limits

log() { echo "gpu-check: $*" | tee -a "$LOG"; }

json_escape() {
    printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' | tr -d '\000-\010\013-\037' |
        awk 'BEGIN { ORS = "" } NR > 1 { print "\\n" } { print }'
}

STEPS_JSON=""
add_step() { # name status rc seconds detail
    local entry
    entry=$(printf '{"name": "%s", "status": "%s", "rc": %s, "seconds": %s, "detail": "%s"}' \
        "$1" "$2" "$3" "$4" "$(json_escape "$5")")
    STEPS_JSON="${STEPS_JSON:+$STEPS_JSON, }$entry"
}

# write_summary: $OUT/summary.json from what the steps left (also after an early stop).
write_summary() {
    TOTAL=$(($(date +%s) - START))
    cat >"$OUT/summary.json" <<EOF
{
  "started": "$(date -u -d "@$START" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null)",
  "total_seconds": $TOTAL,
  "gpus": "$(json_escape "$GPU_INFO")",
  "cuda_root": "$(json_escape "$CUDA_ROOT")",
  "cudnn": {"header": "$(json_escape "$CUDNN_H")", "library": "$(json_escape "$CUDNN_SO")"},
  "cublas": "$(json_escape "$CUBLAS_SO")",
  "onednn": {"include_dir": "$(json_escape "$DNNL_INC")", "library": "$(json_escape "$DNNL_SO")"},
  "zlib": {"include_dir": "$(json_escape "$ZLIB_INC")", "library": "$(json_escape "$ZLIB_SO")"},
  "nccl": "$(json_escape "$NCCL_SO")",
  "dependencies": "$(json_escape "$DEPS_NOTE")",
  "missing": "$(json_escape "${MISSING# }")",
  "fatal": "$(json_escape "$FATAL")",
  "cuda_smoke_rc": $SMOKE_RC,
  "conformance": {"passed": $CONF_PASSED, "failed": $CONF_FAILED, "total": $CONF_TOTAL},
  "cuda_training_tests": {"passed": $TRAIN_PASSED, "failed": $TRAIN_FAILED, "total": $TRAIN_TOTAL},
  "other_tests": {"passed": $TESTS_PASSED, "failed": $TESTS_FAILED, "total": $TESTS_TOTAL},
  "steps": [$STEPS_JSON]
}
EOF
}

GPU_INFO="" CUDA_ROOT="" CUDNN_H="" CUDNN_SO="" CUBLAS_SO="" CUBLAS_H="" NCCL_SO=""
DNNL_INC="" DNNL_SO="" ZLIB_INC="" ZLIB_SO="" DEPS_NOTE="" MISSING="" FATAL="" SMOKE_RC=null
CONF_PASSED=null CONF_FAILED=null CONF_TOTAL=null TRAIN_PASSED=null TRAIN_FAILED=null
TRAIN_TOTAL=null TESTS_PASSED=null TESTS_FAILED=null TESTS_TOTAL=null

# fatal WHAT: the check cannot run; says so, writes the summary and stops (exit 1).
fatal() {
    FATAL="$*"
    log "FATAL: $*"
    add_step preflight fail 1 0 "$*"
    write_summary
    log "stopped after $(($(date +%s) - START))s; summary in $OUT/summary.json"
    rm -rf "$WORK"
    exit 1
}

# ctest_counts OUTPUT: "PASSED FAILED TOTAL" from ctest's last line, or "null null null".
ctest_counts() {
    local line failed total
    line=$(printf '%s\n' "$1" | grep -E 'tests passed, [0-9]+ tests? failed out of' | tail -n 1)
    if [ -z "$line" ]; then
        echo "null null null"
        return
    fi
    failed=$(echo "$line" | sed -E 's/.* ([0-9]+) tests? failed out of.*/\1/')
    total=$(echo "$line" | sed -E 's/.*failed out of ([0-9]+).*/\1/')
    echo "$((total - failed)) $failed $total"
}

# run_step NAME MAX_SECONDS COMMAND...: runs under min(MAX, time left), output to the log.
# Sets STEP_RC and STEP_OUT (the step's output).
run_step() {
    local name=$1 max=$2
    shift 2
    local now left limit t0 status
    now=$(date +%s)
    left=$((DEADLINE - now))
    if [ "$left" -lt 15 ]; then
        log "$name: skipped (out of time)"
        add_step "$name" skipped null 0 "out of time"
        STEP_RC=-1
        STEP_OUT=""
        return
    fi
    limit=$max
    [ "$left" -lt "$limit" ] && limit=$left
    log "---- $name (limit ${limit}s): $*"
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$WORK/step.out" 2>&1
    STEP_RC=$?
    STEP_OUT=$(cat "$WORK/step.out")
    cat "$WORK/step.out" >>"$LOG"
    status=ok
    [ "$STEP_RC" -ne 0 ] && status=fail
    [ "$STEP_RC" -eq 124 ] || [ "$STEP_RC" -eq 137 ] && status=timeout
    log "$name: $status (rc $STEP_RC, $(($(date +%s) - t0))s)"
    add_step "$name" "$status" "$STEP_RC" "$(($(date +%s) - t0))" "$(printf '%s' "$STEP_OUT" | tail -n 15)"
}

# ---- the machine ----

log "started $(date -u +%Y-%m-%dT%H:%M:%SZ) in $REPO, output in $OUT"
CC_ARCH=""
if command -v nvidia-smi >/dev/null 2>&1; then
    GPU_INFO=$(nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version,compute_cap \
        --format=csv,noheader 2>&1)
    { nvidia-smi topo -m 2>&1 || true; } >>"$LOG"
    CC_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
fi
log "gpus: ${GPU_INFO:-none (no nvidia-smi)}"
if ! printf '%s' "$GPU_INFO" | grep -qE '^ *[0-9]+ *,'; then
    fatal "no NVIDIA GPU answers (nvidia-smi: ${GPU_INFO:-not found})"
fi
JOBS=$(nproc 2>/dev/null || echo 4)

# ---- CUDA, cuDNN, cuBLAS, NCCL: the toolkit first, then the Python wheels' folders ----

CUDA_ROOT=""
for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-12; do
    if [ -n "$c" ] && [ -x "$c/bin/nvcc" ]; then CUDA_ROOT=$c; break; fi
done
if [ -z "$CUDA_ROOT" ] && command -v nvcc >/dev/null 2>&1; then
    CUDA_ROOT=$(dirname "$(dirname "$(command -v nvcc)")")
fi
log "cuda toolkit: ${CUDA_ROOT:-not found} ($("${CUDA_ROOT:-/nonexistent}/bin/nvcc" --version 2>/dev/null | tail -n 1))"

SITE_DIRS=""
for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    SITE_DIRS="$SITE_DIRS $("$py" -c 'import site, sys
print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)"
done
for d in /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages \
    /opt/*/.venv/lib/python3*/site-packages; do
    [ -d "$d" ] && SITE_DIRS="$SITE_DIRS $d"
done

# find_first PATTERN DIR...: the first file matching PATTERN in the folders, or nothing.
find_first() {
    local pat=$1 d f
    shift
    for d in "$@"; do
        [ -d "$d" ] || continue
        for f in "$d"/$pat; do
            [ -e "$f" ] && { echo "$f"; return; }
        done
    done
}

WHEEL_INC() { local d; for d in $SITE_DIRS; do echo "$d/nvidia/$1/include"; done; }
WHEEL_LIB() { local d; for d in $SITE_DIRS; do echo "$d/nvidia/$1/lib"; done; }
SYS_INC="${CUDA_ROOT:+$CUDA_ROOT/include} /usr/include /usr/include/x86_64-linux-gnu"
SYS_LIB="${CUDA_ROOT:+$CUDA_ROOT/lib64 $CUDA_ROOT/lib} /usr/lib/x86_64-linux-gnu /usr/lib64"

# shellcheck disable=SC2046,SC2086
CUDNN_H=$(find_first cudnn.h $SYS_INC $(WHEEL_INC cudnn))
# shellcheck disable=SC2046,SC2086
CUDNN_SO=$(find_first 'libcudnn.so*' $SYS_LIB $(WHEEL_LIB cudnn))
# shellcheck disable=SC2046,SC2086
CUBLAS_SO=$(find_first 'libcublas.so*' $SYS_LIB $(WHEEL_LIB cublas))
# shellcheck disable=SC2046,SC2086
CUBLAS_H=$(find_first cublas_v2.h $SYS_INC $(WHEEL_INC cublas))
# shellcheck disable=SC2046,SC2086
NCCL_SO=$(find_first 'libnccl.so*' $SYS_LIB $(WHEEL_LIB nccl))
log "cudnn: header ${CUDNN_H:-not found}, library ${CUDNN_SO:-not found}"
log "cublas: header ${CUBLAS_H:-not found}, library ${CUBLAS_SO:-not found}"
log "nccl: ${NCCL_SO:-not found} (not used by the build)"
[ -n "$CUDA_ROOT" ] || fatal "no CUDA toolkit (nvcc) in CUDA_HOME, CUDA_PATH, /usr/local/cuda* or PATH"
[ -n "$CUDNN_H" ] && [ -n "$CUDNN_SO" ] ||
    fatal "cuDNN not found (header: ${CUDNN_H:-none}, library: ${CUDNN_SO:-none}) in the toolkit, the system or a Python wheel (nvidia-cudnn-cu*)"
[ -n "$CUBLAS_SO" ] && [ -n "$CUBLAS_H" ] ||
    fatal "cuBLAS not found (header: ${CUBLAS_H:-none}, library: ${CUBLAS_SO:-none})"

CMAKE_ARGS=(-DMGT_CUDA=ON -DCMAKE_BUILD_TYPE=Release)
# The GPU's own architecture only: half the compile time of the default 80;90.
CC_ARCH=${MGT_CUDA_ARCHITECTURES:-$CC_ARCH}
[ -n "$CC_ARCH" ] && CMAKE_ARGS+=("-DMGT_CUDA_ARCHITECTURES=$CC_ARCH")
[ -n "$CUDA_ROOT" ] && CMAKE_ARGS+=("-DCMAKE_CUDA_COMPILER=$CUDA_ROOT/bin/nvcc" "-DCUDAToolkit_ROOT=$CUDA_ROOT")
LIBDIRS=""
if [ -n "$CUDNN_H" ] && [ -n "$CUDNN_SO" ]; then
    # A wheel ships libcudnn.so.9 without the unversioned link: hand CMake the file itself.
    CMAKE_ARGS+=("-DCUDNN_INCLUDE_DIR=$(dirname "$CUDNN_H")" "-DCUDNN_LIB=$CUDNN_SO")
    LIBDIRS="$LIBDIRS:$(dirname "$CUDNN_SO")"
fi
case "$CUBLAS_SO" in
"$CUDA_ROOT"/*) ;;
"") ;;
*) # cuBLAS only in a wheel: FindCUDAToolkit's cache variable and the wheel's headers.
    CMAKE_ARGS+=("-DCUDA_cublas_LIBRARY=$CUBLAS_SO" "-DCMAKE_CUDA_FLAGS=-I$(dirname "$CUBLAS_H")")
    LIBDIRS="$LIBDIRS:$(dirname "$CUBLAS_SO")"
    CUBLASLT_SO=$(find_first 'libcublasLt.so*' "$(dirname "$CUBLAS_SO")")
    [ -n "$CUBLASLT_SO" ] && CMAKE_ARGS+=("-DCUDA_cublasLt_LIBRARY=$CUBLASLT_SO")
    ;;
esac

# ---- Debian's packages: the system's, else the carried .debs unpacked privately ----

have_pc() { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists "$1" 2>/dev/null; }
# have_dnnl ROOT: oneDNN's header and library under ROOT (empty: the system's); sets DNNL_INC
# (the folder holding oneapi/dnnl/dnnl.h) and DNNL_SO, which CMake then takes as they are.
have_dnnl() {
    local r=$1 d
    local incs=("$r/usr/include") libs=("$r/usr/lib/x86_64-linux-gnu" "$r/usr/lib64" "$r/usr/lib")
    [ -z "$r" ] && incs+=(/usr/local/include) && libs+=(/usr/local/lib)
    DNNL_INC="" DNNL_SO=""
    for d in "${incs[@]}"; do
        [ -f "$d/oneapi/dnnl/dnnl.h" ] && { DNNL_INC=$d; break; }
    done
    DNNL_SO=$(find_first libdnnl.so "${libs[@]}")
    [ -n "$DNNL_INC" ] && [ -n "$DNNL_SO" ]
}
# have_zlib ROOT: zlib's header and library under ROOT (empty: the system's); sets ZLIB_INC
# and ZLIB_SO, which CMake then takes as they are (FindZLIB would not look in ROOT).
have_zlib() {
    local r=$1 d
    ZLIB_INC="" ZLIB_SO=""
    [ -f "$r/usr/include/zlib.h" ] && ZLIB_INC=$r/usr/include
    for d in "$r/usr/lib/x86_64-linux-gnu" "$r/lib/x86_64-linux-gnu" "$r/usr/lib64" "$r/usr/lib"; do
        ZLIB_SO=$(find_first 'libz.so' "$d")
        # -e follows the link: zlib1g-dev's libz.so points into the system's /lib
        [ -n "$ZLIB_SO" ] && [ -e "$ZLIB_SO" ] && break
        ZLIB_SO=""
    done
    [ -n "$ZLIB_INC" ] && [ -n "$ZLIB_SO" ]
}
STB_DIR=""
[ -f /usr/include/stb/stb_image.h ] && STB_DIR=/usr/include
MISSING=""
have_dnnl "" || MISSING="$MISSING onednn"
have_zlib "" || MISSING="$MISSING zlib"
have_pc libcjson || MISSING="$MISSING cjson"
have_pc cmocka || MISSING="$MISSING cmocka"
[ -n "$STB_DIR" ] || MISSING="$MISSING stb"
command -v pkg-config >/dev/null 2>&1 || MISSING="$MISSING pkg-config"
DEPS_NOTE="system packages"
# MGT_GPU_CHECK_USE_DEBS=1 takes the carried .debs even where the system has the packages,
# to try that path on a machine that has them.
[ "${MGT_GPU_CHECK_USE_DEBS:-0}" = 1 ] && MISSING="$MISSING (forced)"
if [ -n "$MISSING" ]; then
    log "missing on this machine:$MISSING"
    DEBS=$(ls "$REPO"/.gpu-deps/*.deb 2>/dev/null)
    if [ -n "$DEBS" ]; then
        # Beside the build folder, not in a temporary one: the CMake cache keeps its paths.
        ROOT=$BUILD-deps
        rm -rf "$ROOT"
        mkdir -p "$ROOT"
        for deb in $DEBS; do
            if command -v dpkg-deb >/dev/null 2>&1; then
                dpkg-deb -x "$deb" "$ROOT"
            else # ar + tar, for a machine without dpkg
                (cd "$WORK" && ar x "$deb" && tar -xf data.tar.* -C "$ROOT" && rm -f data.tar.* control.tar.* debian-binary)
            fi
        done
        # Absolute links (zlib1g-dev's libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) name
        # the system, which may have another version: point them into the prefix instead.
        find "$ROOT" -type l | while read -r l; do
            t=$(readlink "$l")
            case "$t" in /*) [ -e "$ROOT$t" ] && ln -sfn "$ROOT$t" "$l" ;; esac
        done
        # Debian's .pc files name absolute /usr paths; point them into the private prefix.
        find "$ROOT" -name '*.pc' -exec sed -i -e "s#=/usr/#=$ROOT/usr/#" -e "s#=/usr\$#=$ROOT/usr#" {} +
        ML=$ROOT/usr/lib/x86_64-linux-gnu
        export PKG_CONFIG_PATH="$ML/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
        # Now for the unpacked pkgconf, later for the build's links and the tests: libdnnl.so
        # needs the unpacked libOpenCL.so.1, which neither its nor our RUNPATH names.
        export LD_LIBRARY_PATH="$ML${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        if ! command -v pkg-config >/dev/null 2>&1 && [ -x "$ROOT/usr/bin/pkgconf" ]; then
            CMAKE_ARGS+=("-DPKG_CONFIG_EXECUTABLE=$ROOT/usr/bin/pkgconf")
            export PATH="$ROOT/usr/bin:$PATH"
            ln -sf pkgconf "$ROOT/usr/bin/pkg-config"
        fi
        [ -z "$STB_DIR" ] && [ -f "$ROOT/usr/include/stb/stb_image.h" ] && STB_DIR=$ROOT/usr/include
        DEPS_NOTE="unpacked from .gpu-deps ($(echo "$DEBS" | wc -w) packages)"
        MISSING=""
        have_dnnl "$ROOT" || have_dnnl "" || MISSING="$MISSING onednn"
        have_zlib "$ROOT" || have_zlib "" || MISSING="$MISSING zlib"
        have_pc libcjson || MISSING="$MISSING cjson"
        have_pc cmocka || MISSING="$MISSING cmocka"
        [ -n "$STB_DIR" ] || MISSING="$MISSING stb"
    else
        DEPS_NOTE="no .gpu-deps/ carried (make it with tools/gpu-check.sh --fetch-deps)"
    fi
fi
[ -n "$STB_DIR" ] && CMAKE_ARGS+=("-DSTB_INCLUDE_DIR=$STB_DIR")
[ -n "$ZLIB_INC" ] && [ -n "$ZLIB_SO" ] && CMAKE_ARGS+=("-DZLIB_INCLUDE_DIR=$ZLIB_INC" "-DZLIB_LIBRARY=$ZLIB_SO")
log "zlib: header folder ${ZLIB_INC:-not found}, library ${ZLIB_SO:-not found}"
# Both given, as found here: find_path and find_library would not look again past a cached answer.
[ -n "$DNNL_INC" ] && [ -n "$DNNL_SO" ] && CMAKE_ARGS+=("-DDNNL_INCLUDE_DIR=$DNNL_INC" "-DDNNL_LIB=$DNNL_SO")
log "onednn: header folder ${DNNL_INC:-not found}, library ${DNNL_SO:-not found}"
# mgt_core links -lgomp and onednn.c includes omp.h: the compiler's own, not from a .deb.
GOMP_SO=$("${CC:-cc}" -print-file-name=libgomp.so 2>/dev/null)
case "$GOMP_SO" in
/*) ;;
*) log "warning: the C compiler (${CC:-cc}) has no libgomp.so: linking mgt_core (-lgomp) will fail" ;;
esac
log "dependencies: $DEPS_NOTE; still missing:${MISSING:- nothing}"
# Without any of them the build (or, cmocka, every test) cannot happen: say so now, not after
# minutes of configure and build.
[ -z "$MISSING" ] || fatal "missing:$MISSING ($DEPS_NOTE)"
CMAKE_ARGS+=("-DMGT_TEST_TIMEOUT=$TEST_TIMEOUT")
# No empty entry: one would put the current folder on the search path.
LIBDIRS=${LIBDIRS#:}
[ -n "$LIBDIRS" ] && export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GEN="Unix Makefiles"
command -v ninja >/dev/null 2>&1 && GEN=Ninja
CMAKE_ARGS+=(-G "$GEN")
# A build folder made by another generator cannot be reused, nor one configured against the
# other copy of the packages (system or unpacked): pkg-config's answers stay in its cache.
USED_DEBS=0 CACHED_DEBS=0
case "$DEPS_NOTE" in unpacked*) USED_DEBS=1 ;; esac
if [ -f "$BUILD/CMakeCache.txt" ]; then
    grep -qF "$BUILD-deps/" "$BUILD/CMakeCache.txt" && CACHED_DEBS=1
    if ! grep -q "^CMAKE_GENERATOR:INTERNAL=$GEN\$" "$BUILD/CMakeCache.txt" || [ "$USED_DEBS" != "$CACHED_DEBS" ]; then
        log "starting $BUILD afresh (other generator or other packages)"
        rm -rf "$BUILD"
    fi
fi

# ---- build and run ----

run_step configure 60 cmake -S "$REPO" -B "$BUILD" "${CMAKE_ARGS[@]}"
CONFIGURED=$STEP_RC
BUILT=1
if [ "$CONFIGURED" -eq 0 ]; then
    run_step build 240 cmake --build "$BUILD" -j "$JOBS"
    BUILT=$STEP_RC
    if [ "$BUILT" -ne 0 ] && [ "$STEP_RC" -ne 124 ]; then
        # Other people's half-written files can break the full build: the backend and the
        # smoke test alone still say whether the CUDA code builds and runs.
        run_step build-cuda-only 90 cmake --build "$BUILD" -j "$JOBS" --target cuda_smoke
    fi
fi

if [ -x "$BUILD/cuda_smoke" ]; then
    run_step cuda_smoke 45 "$BUILD/cuda_smoke"
    SMOKE_RC=$STEP_RC
    run_step cuda_smoke_sync 60 env MGT_CUDA_SYNC=1 "$BUILD/cuda_smoke"
    [ "$SMOKE_RC" -eq 0 ] && SMOKE_RC=$STEP_RC
fi

if [ -x "$BUILD/tests/test_conformance" ]; then
    # One op directly: its output says whether CUDA took part ("cuda: skipped" if not).
    run_step conformance-probe 20 "$BUILD/tests/test_conformance" fill
    run_step conformance 90 ctest --test-dir "$BUILD" -L conformance -j 8 --output-on-failure
    read -r CONF_PASSED CONF_FAILED CONF_TOTAL <<<"$(ctest_counts "$STEP_OUT")"
fi

if [ -f "$BUILD/CTestTestfile.cmake" ] && [ "$BUILT" -eq 0 ]; then
    # The trainer on CUDA replicas (learning, bit-identical resume) and the models against
    # PyTorch's goldens on CUDA, before the benchmark (which times the CPU path).
    run_step cuda-training-tests 100 ctest --test-dir "$BUILD" -L 'train|models' -j 4 --output-on-failure
    read -r TRAIN_PASSED TRAIN_FAILED TRAIN_TOTAL <<<"$(ctest_counts "$STEP_OUT")"
fi

if [ -x "$BUILD/mgtrain" ]; then
    run_step devices 20 "$BUILD/mgtrain" devices --device cuda --gpus 0,0
    run_step devices-no-p2p 20 env MGT_NO_P2P=1 "$BUILD/mgtrain" devices --device cuda --gpus 0,0
fi

if [ -x "$BUILD/bench_kernels" ]; then
    BENCH_ARGS=(--json "$OUT/bench.json")
    # The benchmark times the CPU path today; once it learns a device flag, use the GPU.
    if "$BUILD/bench_kernels" --help 2>&1 | grep -q -- '--device'; then
        BENCH_ARGS+=(--device cuda)
    else
        BENCH_ARGS+=(--threads "$JOBS" --repeats 3)
    fi
    run_step bench_kernels 45 "$BUILD/bench_kernels" "${BENCH_ARGS[@]}"
fi

if [ -x "$BUILD/mgtrain" ]; then
    # The training step on the GPU: resnet50 at 224, fp32 (FMA), TF32, and both --amp
    # precisions (cuBLAS and cuDNN's tensor cores, cuDNN's 16-bit NHWC convolutions).
    for prec in f32 tf32 bf16 fp16; do
        case $prec in
        f32) extra=() ;;
        tf32) extra=(--tf32) ;;
        *) extra=(--amp "$prec") ;;
        esac
        run_step "bench-resnet50-$prec" 40 "$BUILD/mgtrain" bench --device cuda --gpus 0 \
            -a resnet50 -b 64 --dummy --steps 5 --warmup 2 "${extra[@]}" \
            --json "$OUT/bench-resnet50-$prec.json"
    done
fi

if [ -f "$BUILD/CTestTestfile.cmake" ] && [ "$BUILT" -eq 0 ]; then
    # What is left: the device, stream, collective, data and other tests.
    run_step other-tests 90 ctest --test-dir "$BUILD" -LE 'conformance|train|models' -j 8 --output-on-failure
    read -r TESTS_PASSED TESTS_FAILED TESTS_TOTAL <<<"$(ctest_counts "$STEP_OUT")"
fi

# ---- summary ----

write_summary
log "done in ${TOTAL}s; summary in $OUT/summary.json"
printf 'step summary:\n'
grep -E '^gpu-check: [a-z0-9_-]+: (ok|fail|timeout|skipped)' "$LOG" | sed 's/^gpu-check: /  /'
rm -rf "$WORK"
FAILED=$(grep -cE '^gpu-check: [a-z0-9_-]+: (fail|timeout)' "$LOG")
[ "$FAILED" -eq 0 ]
