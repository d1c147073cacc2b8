#!/usr/bin/env bash
# The one run on a GPU machine: proves CUDA opens, builds the CUDA backend and runs every CUDA check in 540 s, packing all it saw into one archive.
#
#   tools/gpu-check.sh [--stop-after STAGE]   on the GPU machine (any folder; the repository is
#                                             the script's own); exit 0 only if CUDA ran and
#                                             every stage up to STAGE (default: all) passed
#   tools/gpu-check.sh --fetch-deps           here beforehand (Debian 12, apt): Debian's .debs
#                                             the build needs into .gpu-deps/ (git ignores it;
#                                             carry it to the GPU machine)
#   tools/gpu-check.sh --compare-losses MOCK.jsonl CUDA.jsonl
#                                             the train stage's comparison of two --log files
#   tools/gpu-check.sh --check-cuda16 LOG...  the conformance stage's check that CUDA compared
#                                             the 16-bit NHWC cases (ctest's LastTest.log)
#
# The stages, in this order, each with its own budget (seconds) under one deadline of 540 s
# (the device tool's command limit is 600): correctness first, training and benchmarks last,
# so that a slow cuDNN search cannot eat the checks that say whether the code is right.
#   preflight   30  nvidia-smi -q and topo -m, the toolkit, cuDNN, cuBLAS and NCCL found,
#                   Debian's packages (the system's, else .gpu-deps/ unpacked privately)
#   probe       30  src/device/cuda/probe.c alone, compiled and run: CUDA opens, or the
#                   runtime's own reason, versions and compute modes, and the run stops
#   configure   45  cmake -DMGT_CUDA=ON -DMGT_MPI=OFF for the GPU's own architecture
#   build      200  only what the stages run (mgtrain, cuda_smoke, three test executables)
#   smoke       25  cuda_smoke, asynchronous
#   smoke-sync  30  cuda_smoke under MGT_CUDA_SYNC=1 (a fault pinned to its launch)
#   conformance 75  every op of the op list, the 16-bit ones too, CUDA beside the reference;
#                   the kinds that take a layout must have compared NHWC 16-bit cases on CUDA
#   reruns      60  each failed op again under MGT_CUDA_SYNC=1 and compute-sanitizer memcheck
#   ctest-smoke 45  ctest -L smoke: whole runs of mgtrain on data/sample, on CUDA
#   models      50  test_models on CUDA (MGT_TEST_DEVICE=cuda): PyTorch's goldens
#   train-cuda  60  test_train's runs on replicas 0,0,0,0 (learning) and 0,0 (resume bits)
#   devices     20  mgtrain devices --device cuda --gpus 0,0, and again with MGT_NO_P2P=1
#   bytes       10  mgtrain model -a resnet50 --amp bf16 --bytes -b 256: the bytes a step moves,
#                   old and channels-last path, and their bound at 3.35 TB/s (beside bench)
#   train       60  resnet20 on data/sample, one epoch on --gpus 0,0 (CUDA) and 0,1 (mock):
#                   the loss trajectories must agree (--compare-losses's tolerances)
#   survive     60  --on-device-failure continue on replicas 0,0,0,0: replica 2 hung by
#                   MGT_CUDA_FAULT in step 2, then replica 1 gone; each run must drop the one
#                   replica, finish the epoch on 3 and validate all 300 images
#   bench       60  mgtrain bench resnet50 --gpus 0,0: the timed search and the tree
#                   all-reduce of two replicas at once
#   bench-ring  40  the same with --amp bf16 --grad-dtype bf16 --allreduce ring (the channels-last
#                   NHWC bf16 path: its banner line must say so, with activations in 16 bits)
#   bench-det   40  the same with --deterministic --amp bf16, cuDNN's API log on
# MGT_REQUIRE_CUDA=1 from the probe on: a CUDA test that would skip, a run that would fall back
# to mock devices, fails instead; a CUDA stage whose output still says it skipped fails too.
# MGT_CUDNN_WORKSPACE_MB (256 here unless set) bounds cuDNN's searches.
#
# $OUT (default ./gpu-check-out) receives gpu-check.tar.gz (everything: the log, summary.json,
# every stage's output, ctest's JUnit files and LastTest.log, nvidia-smi -q, topo -m, ldd of the
# binaries, the versions loaded, cuDNN's algorithm per shape, cuDNN's API log of one benchmark,
# the training logs, the benchmarks' JSON), and gpu-check.log and summary.json beside it. The
# archive is written however the run ends. The last line printed is the verdict.
set -u

REPO=$(cd "$(dirname "$0")/.." && pwd)
STAGES="preflight probe configure build smoke smoke-sync conformance reruns ctest-smoke models \
train-cuda devices bytes train survive bench bench-ring bench-det"
TOTAL_BUDGET=540

# libdnnl2 also needs libc6, libgcc-s1, libstdc++6 and libgomp1, which every machine with GCC
# has; the build's -lgomp and omp.h are GCC's own (libgcc-N-dev), which no .deb here replaces,
# and an older libgomp.so.1 on LD_LIBRARY_PATH would shadow the compiler's: libgomp1 stays out.
DEB_PACKAGES="libdnnl-dev libdnnl2 ocl-icd-libopencl1 libcjson-dev libcjson1 libcmocka-dev
libcmocka0 libstb-dev libstb0 zlib1g-dev zlib1g libturbojpeg0-dev libturbojpeg0
libjpeg62-turbo-dev libjpeg62-turbo pkgconf pkgconf-bin libpkgconf3"

# ---- --compare-losses: the train stage's verdict, also a test of its own ----

# compare_losses MOCK CUDA: each training step's loss of CUDA's --log against the mock's, in
# order. Relative tolerance by step k of the run: 1e-4, 1e-3, 1e-2, then 2e-2. Same weights
# and images, so step 0 differs only by the convolutions' summation order; the gap then grows
# with every update (measured 2026-12-06 between two mock runs whose convolutions differ only
# in that order, oneDNN's against im2col + gemm, resnet20 on data/sample, -b 64 on 2 devices:
# 0, 2.2e-6, 1.2e-4 to 5.9e-4, 1.1e-3, 2.2e-3 to 4.3e-3 at steps 0 to 4).
compare_losses() {
    awk -v mockf="$1" -v cudaf="$2" '
    function losses(file, arr,    n, line, v) {
        n = 0
        while ((getline line < file) > 0) {
            if (line !~ /"type":"train"/)
                continue
            v = line
            sub(/.*"loss":/, "", v)
            sub(/[,}].*/, "", v)
            arr[n++] = v + 0
        }
        close(file)
        return n
    }
    BEGIN {
        nm = losses(mockf, m)
        nc = losses(cudaf, c)
        if (nm < 5 || nc != nm) {
            printf "compare-losses: FAIL: %d training steps logged in %s, %d in %s (5 or more, as many)\n", nm, mockf, nc, cudaf
            exit 1
        }
        bad = 0
        for (k = 0; k < nm; k++) {
            tol = k == 0 ? 1e-4 : k == 1 ? 1e-3 : k == 2 ? 1e-2 : 2e-2
            d = c[k] - m[k]
            if (d < 0) d = -d
            ref = m[k] < 0 ? -m[k] : m[k]
            rel = d / (ref > 1e-6 ? ref : 1e-6)
            ok = rel <= tol
            bad += !ok
            printf "compare-losses: step %d: mock %.6f cuda %.6f relative %.2e (tolerance %.0e) %s\n", k, m[k], c[k], rel, tol, ok ? "ok" : "FAIL"
        }
        if (bad) {
            printf "compare-losses: FAIL: %d of %d steps outside the tolerance\n", bad, nm
            exit 1
        }
        printf "compare-losses: ok: %d steps within the tolerance\n", nm
    }'
}

# ---- --check-cuda16: the conformance stage's proof that CUDA ran the 16-bit NHWC cases ----

# The kinds that take a layout: each one's summary line must count NHWC cases and CUDA among
# its backends (3: the mock twice and CUDA), and pass.
CUDA16_OPS="conv2d_forward conv2d_backward_data conv2d_backward_filter batchnorm_forward_train
batchnorm_forward_eval batchnorm_backward maxpool2d_forward maxpool2d_backward avgpool_forward
avgpool_backward adaptive_avgpool_forward adaptive_avgpool_backward channel_bias_forward
channel_bias_backward channel_scale_forward channel_scale_backward dropout
layernorm_channels_forward layernorm_channels_backward"
check_cuda16() {
    local op line bad=0
    for op in $CUDA16_OPS; do
        line=$(cat "$@" 2>/dev/null | grep -m1 "^conformance $op: ")
        case "$line" in
        *" 0 NHWC)"*) echo "check-cuda16: FAIL: $op compared no NHWC case: $line"; bad=1 ;;
        *" NHWC) on 3 backends"*": ok") echo "check-cuda16: $op: ${line#*: }" ;;
        "") echo "check-cuda16: FAIL: $op: no summary line"; bad=1 ;;
        *) echo "check-cuda16: FAIL: $op did not pass its NHWC 16-bit cases on CUDA: $line"; bad=1 ;;
        esac
    done
    return $bad
}

case "${1:-}" in
--fetch-deps)
    # apt-get download fetches single .deb files into the current folder; no root needed
    # once the package lists exist.
    mkdir -p "$REPO/.gpu-deps" && cd "$REPO/.gpu-deps" || exit 1
    # shellcheck disable=SC2086
    apt-get download $DEB_PACKAGES || exit 1
    echo "gpu-check: $(find . -name '*.deb' | wc -l) packages in .gpu-deps/ ($(du -sh . | cut -f1));"
    echo "  carry .gpu-deps to the GPU machine (git ignores it)"
    exit 0
    ;;
--compare-losses)
    [ $# -eq 3 ] || { echo "usage: $0 --compare-losses MOCK.jsonl CUDA.jsonl" >&2; exit 2; }
    compare_losses "$2" "$3"
    exit
    ;;
--check-cuda16)
    [ $# -ge 2 ] || { echo "usage: $0 --check-cuda16 LOG..." >&2; exit 2; }
    shift
    check_cuda16 "$@"
    exit
    ;;
--stop-after)
    STOP_AFTER=${2:-}
    case " $STAGES " in
    *" $STOP_AFTER "*) ;;
    *) echo "gpu-check: --stop-after '$STOP_AFTER': expected one of: $STAGES" >&2; exit 2 ;;
    esac
    [ $# -eq 2 ] || { echo "gpu-check: unexpected argument '${3:-}'" >&2; exit 2; }
    ;;
"") STOP_AFTER="" ;;
*)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac

OUT=${OUT:-$REPO/gpu-check-out}
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/gpu-check.XXXXXX)
PACK=$WORK/gpu-check # what the archive holds
mkdir -p "$PACK/stages" "$PACK/junit" "$PACK/machine"
LOG=$PACK/gpu-check.log
: >"$LOG"
BUILD=${MGT_GPU_CHECK_BUILD:-$REPO/build-gpu}
START=$(date +%s)
DEADLINE=$((START + TOTAL_BUDGET))
export MGT_CUDNN_WORKSPACE_MB=${MGT_CUDNN_WORKSPACE_MB:-256}
export MGT_CUDNN_ALGO_LOG=$PACK/cudnn-algos.log

log() { echo "gpu-check: $*" | tee -a "$LOG"; }

json_escape() {
    printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' | tr -d '\000-\010\013-\037' |
        awk 'BEGIN { ORS = "" } NR > 1 { print "\\n" } { print }'
}

STAGES_JSON="" FIRST_FAIL="" NSTAGE=0 VERDICT="" FACTS=""
fact() { # KEY VALUE: a line of summary.json's "facts"
    FACTS="${FACTS:+$FACTS,
}    \"$1\": \"$(json_escape "$2")\""
}

# stage_done NAME STATUS RC SECONDS BUDGET DETAIL
stage_done() {
    local entry
    entry=$(printf '{"name": "%s", "status": "%s", "rc": %s, "seconds": %s, "budget": %s, "detail": "%s"}' \
        "$1" "$2" "$3" "$4" "$5" "$(json_escape "$6")")
    STAGES_JSON="${STAGES_JSON:+$STAGES_JSON,
    }$entry"
    printf '  %-12s %-8s %4ss of %4ss  %s\n' "$1" "$2" "$4" "$5" "$(printf '%s' "$6" | tail -n 1 | cut -c1-150)" >>"$WORK/table"
    if [ "$2" != ok ] && [ -z "$FIRST_FAIL" ]; then
        FIRST_FAIL="$1: $(printf '%s' "$6" | tail -n 1)"
    fi
}

write_summary() {
    local total=$(($(date +%s) - START))
    cat >"$PACK/summary.json" <<EOF
{
  "result": "$([ -z "$FIRST_FAIL" ] && echo pass || echo fail)",
  "first_failure": "$(json_escape "$FIRST_FAIL")",
  "started": "$(date -u -d "@$START" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null)",
  "total_seconds": $total,
  "budget_seconds": $TOTAL_BUDGET,
  "stop_after": "$STOP_AFTER",
  "facts": {
$FACTS
  },
  "stages": [
    $STAGES_JSON
  ]
}
EOF
}

# The archive, whatever happened: the files that come back from a GPU machine are few (8) and
# small (16 MiB each), so everything goes into one, with the biggest logs cut to size.
pack() {
    write_summary
    [ -f "$WORK/table" ] && cp "$WORK/table" "$PACK/stages.txt"
    for f in "$PACK"/*.log "$PACK"/stages/*.log; do
        [ -f "$f" ] || continue
        if [ "$(stat -c %s "$f")" -gt $((6 << 20)) ]; then
            { head -c $((3 << 20)) "$f"; printf '\n... cut: %s bytes in all ...\n' "$(stat -c %s "$f")"; tail -c $((3 << 20)) "$f"; } >"$f.cut"
            mv "$f.cut" "$f"
        fi
    done
    tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" gpu-check 2>/dev/null
    if [ "$(stat -c %s "$OUT/gpu-check.tar.gz" 2>/dev/null || echo 0)" -gt $((15 << 20)) ]; then
        rm -f "$PACK/cudnn-api.log"
        echo "cudnn-api.log left out: the archive was over 15 MiB" >>"$PACK/stages.txt"
        tar -czf "$OUT/gpu-check.tar.gz" -C "$WORK" gpu-check 2>/dev/null
    fi
    cp "$PACK/summary.json" "$PACK/gpu-check.log" "$OUT/" 2>/dev/null
}

finish() {
    local rc=1
    [ -z "$FIRST_FAIL" ] && rc=0
    if [ -z "$VERDICT" ]; then # an early exit (an error of this script, a signal)
        [ -n "$FIRST_FAIL" ] || FIRST_FAIL="gpu-check: stopped early (signal or script error)"
        rc=1
    fi
    {
        echo "stages (status, seconds of budget, last line):"
        cat "$WORK/table" 2>/dev/null
    } | tee -a "$LOG"
    pack
    local total=$(($(date +%s) - START))
    if [ "$rc" -eq 0 ] && [ -z "$STOP_AFTER" ]; then
        echo "gpu-check: PASS: CUDA ran and every stage passed in ${total}s; archive $OUT/gpu-check.tar.gz"
    elif [ "$rc" -eq 0 ]; then
        echo "gpu-check: PASS through $STOP_AFTER in ${total}s$([ "$STOP_AFTER" = preflight ] && echo " (CUDA not tried)"); archive $OUT/gpu-check.tar.gz"
    else
        echo "gpu-check: FAIL after ${total}s: $FIRST_FAIL (archive $OUT/gpu-check.tar.gz)"
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap finish EXIT
trap 'exit 1' INT TERM

# Each stage runs in a process group of its own (job control), so that its budget ends all it
# started, shell functions included (which timeout(1) cannot run).
set -m

# run_limited LIMIT COMMAND...: COMMAND (a program or a function of this script) with no input,
# ended after LIMIT seconds (TERM, then KILL 5 s later): then 124, as timeout(1) says it.
run_limited() {
    local limit=$1 pid watch rc
    shift
    rm -f "$WORK/expired"
    ("$@") </dev/null &
    pid=$!
    (
        sleep "$limit"
        touch "$WORK/expired"
        kill -TERM -- "-$pid"
        sleep 5
        kill -KILL -- "-$pid"
    ) </dev/null >/dev/null 2>&1 &
    watch=$!
    wait "$pid"
    rc=$?
    kill -- "-$watch" 2>/dev/null
    wait "$watch" 2>/dev/null
    [ -f "$WORK/expired" ] && rc=124
    return "$rc"
}

# run_stage NAME BUDGET COMMAND...: runs COMMAND under min(BUDGET, time left), its output in
# stages/NN-NAME.log and the log. Sets STAGE_RC and STAGE_LOG. A stage that cannot start for
# lack of time is a failure: what it checks was not seen.
run_stage() {
    local name=$1 budget=$2
    shift 2
    NSTAGE=$((NSTAGE + 1))
    STAGE_LOG=$PACK/stages/$(printf '%02d' "$NSTAGE")-$name.log
    local now left limit t0 secs status
    now=$(date +%s)
    left=$((DEADLINE - now - 10)) # 10 s for a kill's grace and the archive
    if [ "$left" -lt 5 ]; then
        log "$name: not run: out of time (${TOTAL_BUDGET}s in all)"
        stage_done "$name" skipped null 0 "$budget" "not run: out of time"
        STAGE_RC=124
        : >"$STAGE_LOG"
        return
    fi
    limit=$budget
    [ "$left" -lt "$limit" ] && limit=$left
    log "---- [$((now - START))s] $name (budget ${limit}s): $*"
    t0=$(date +%s)
    run_limited "$limit" "$@" >"$STAGE_LOG" 2>&1
    STAGE_RC=$?
    secs=$(($(date +%s) - t0))
    cat "$STAGE_LOG" >>"$LOG"
    status=ok
    [ "$STAGE_RC" -ne 0 ] && status=fail
    if [ "$STAGE_RC" -eq 124 ]; then
        status=timeout
        echo "(stopped at its budget of ${limit}s)" >>"$STAGE_LOG"
    fi
    log "$name: $status (rc $STAGE_RC, ${secs}s of ${limit}s)"
    stage_done "$name" "$status" "$STAGE_RC" "$secs" "$limit" "$(tail -n 12 "$STAGE_LOG")"
}

# check_stage NAME DETAIL: turns the stage just run into a failure (a skip seen in its output).
check_stage_failed() {
    FIRST_FAIL=${FIRST_FAIL:-"$1: $2"}
    STAGES_JSON="$STAGES_JSON,
    {\"name\": \"$1\", \"status\": \"fail\", \"rc\": null, \"seconds\": 0, \"budget\": 0, \"detail\": \"$(json_escape "$2")\"}"
    printf '  %-12s %-8s %s\n' "$1" fail "$2" >>"$WORK/table"
    log "$1: FAIL: $2"
}

# A CUDA stage whose output (ctest's LastTest.log too: it keeps what passing tests printed)
# says something skipped for want of CUDA did not test CUDA.
no_cuda_skips() {
    local name=$1 hit
    hit=$(cat "$STAGE_LOG" "$PACK/junit/LastTest-$name.log" 2>/dev/null |
        grep -E 'cuda: skipped|cuda_smoke: skipped|skipped: no CUDA|: skipped: .*CUDA|\[  SKIPPED \]|no CUDA device found; using CPU mock' |
        head -n 1)
    [ -z "$hit" ] || check_stage_failed "$name" "a CUDA check skipped: $hit"
}

stop_here() { # true when the run ends after stage $1
    [ "$STOP_AFTER" = "$1" ]
}

ctest_counts() { # the last "N% tests passed, F tests failed out of T" of the stage log
    grep -E 'tests passed, [0-9]+ tests? failed out of' "$STAGE_LOG" | tail -n 1
}

# ==== preflight: the machine, the toolkit, the packages ====

preflight() {
    echo "host: $(uname -srm), $(nproc) cores, $(awk '/MemTotal/ {print int($2/1048576) " GiB"}' /proc/meminfo)"
    echo "repository: $REPO ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo 'no git'))"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -q >"$PACK/machine/nvidia-smi-q.txt" 2>&1
        nvidia-smi topo -m >"$PACK/machine/topo.txt" 2>&1
        nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version,compute_cap,compute_mode \
            --format=csv,noheader 2>&1
    else
        echo "nvidia-smi: not found (no NVIDIA driver here?)"
    fi
    echo "compilers: cc $(${CC:-cc} -dumpfullversion 2>/dev/null || echo missing), c++ $(c++ -dumpfullversion 2>/dev/null || echo missing), cmake $(cmake --version 2>/dev/null | head -n 1 | awk '{print $3}'), ninja $(ninja --version 2>/dev/null || echo missing)"
    echo "cuda toolkit: ${CUDA_ROOT:-not found} ($("${CUDA_ROOT:-/nonexistent}/bin/nvcc" --version 2>/dev/null | tail -n 1))"
    echo "cudnn: header ${CUDNN_H:-not found}, library ${CUDNN_SO:-not found}"
    echo "cublas: header ${CUBLAS_H:-not found}, library ${CUBLAS_SO:-not found}"
    echo "nccl: library ${NCCL_SO:-not found}, header ${NCCL_H:-not found} (configure says whether it is built)"
    echo "packages: $DEPS_NOTE; missing:${MISSING:- nothing}"
    [ -n "$CUDA_ROOT" ] || { echo "FAIL: no CUDA toolkit (nvcc) in CUDA_HOME, CUDA_PATH, /usr/local/cuda* or PATH"; return 1; }
    [ -n "$CUDNN_H" ] && [ -n "$CUDNN_SO" ] || { echo "FAIL: cuDNN not found (header ${CUDNN_H:-none}, library ${CUDNN_SO:-none}) in the toolkit, the system or a Python wheel (nvidia-cudnn-cu*)"; return 1; }
    [ -n "$CUBLAS_H" ] && [ -n "$CUBLAS_SO" ] || { echo "FAIL: cuBLAS not found (header ${CUBLAS_H:-none}, library ${CUBLAS_SO:-none})"; return 1; }
    [ -z "$MISSING" ] || { echo "FAIL: packages missing:$MISSING ($DEPS_NOTE)"; return 1; }
    command -v "${CC:-cc}" >/dev/null 2>&1 || { echo "FAIL: no C compiler (${CC:-cc}): nvcc needs one too"; return 1; }
    command -v cmake >/dev/null 2>&1 || { echo "FAIL: no cmake (the build needs CMake 3.25 or newer)"; return 1; }
    return 0
}

CUDA_ROOT=""
for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-12; do
    if [ -n "$c" ] && [ -x "$c/bin/nvcc" ]; then CUDA_ROOT=$c; break; fi
done
if [ -z "$CUDA_ROOT" ] && command -v nvcc >/dev/null 2>&1; then
    CUDA_ROOT=$(dirname "$(dirname "$(command -v nvcc)")")
fi

SITE_DIRS=""
for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    SITE_DIRS="$SITE_DIRS $("$py" -c 'import site
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
SYS_LIB="${CUDA_ROOT:+$CUDA_ROOT/lib64 $CUDA_ROOT/lib $CUDA_ROOT/targets/x86_64-linux/lib} /usr/lib/x86_64-linux-gnu /usr/lib64"
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
# shellcheck disable=SC2046,SC2086
NCCL_H=$(find_first nccl.h $SYS_INC $(WHEEL_INC nccl))
CUDART_SO=$(find_first 'libcudart.so*' ${CUDA_ROOT:+$CUDA_ROOT/lib64 $CUDA_ROOT/lib $CUDA_ROOT/targets/x86_64-linux/lib})

CMAKE_ARGS=(-DMGT_CUDA=ON -DMGT_MPI=OFF -DCMAKE_BUILD_TYPE=Release -DMGT_TEST_TIMEOUT=120)
CC_ARCH=""
command -v nvidia-smi >/dev/null 2>&1 &&
    CC_ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
# The GPU's own architecture only: half the compile time of the default 80;90.
CC_ARCH=${MGT_CUDA_ARCHITECTURES:-${CC_ARCH:-90}}
CMAKE_ARGS+=("-DMGT_CUDA_ARCHITECTURES=$CC_ARCH")
[ -n "$CUDA_ROOT" ] && CMAKE_ARGS+=("-DCMAKE_CUDA_COMPILER=$CUDA_ROOT/bin/nvcc" "-DCUDAToolkit_ROOT=$CUDA_ROOT")
LIBDIRS=""
if [ -n "$CUDNN_H" ] && [ -n "$CUDNN_SO" ]; then
    # A wheel ships libcudnn.so.9 without the unversioned link: hand CMake the file itself.
    CMAKE_ARGS+=("-DCUDNN_INCLUDE_DIR=$(dirname "$CUDNN_H")" "-DCUDNN_LIB=$CUDNN_SO")
    LIBDIRS="$LIBDIRS:$(dirname "$CUDNN_SO")"
fi
case "$CUBLAS_SO" in
"$CUDA_ROOT"/* | "") ;;
*) # cuBLAS only in a wheel: FindCUDAToolkit's cache variable and the wheel's headers.
    CMAKE_ARGS+=("-DCUDA_cublas_LIBRARY=$CUBLAS_SO" "-DCMAKE_CUDA_FLAGS=-I$(dirname "$CUBLAS_H")")
    LIBDIRS="$LIBDIRS:$(dirname "$CUBLAS_SO")"
    CUBLASLT_SO=$(find_first 'libcublasLt.so*' "$(dirname "$CUBLAS_SO")")
    [ -n "$CUBLASLT_SO" ] && CMAKE_ARGS+=("-DCUDA_cublasLt_LIBRARY=$CUBLASLT_SO")
    ;;
esac
# NCCL where CMake's own search would not look (a wheel's folder); it says whether it built it.
[ -n "$NCCL_SO" ] && [ -n "$NCCL_H" ] &&
    CMAKE_ARGS+=("-DNCCL_LIB=$NCCL_SO" "-DNCCL_INCLUDE_DIR=$(dirname "$NCCL_H")") &&
    LIBDIRS="$LIBDIRS:$(dirname "$NCCL_SO")"

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
# missing_now ROOT: the pieces still missing, as the Debian packages that bring them.
missing_now() {
    local r=$1 m=""
    have_dnnl "$r" || have_dnnl "" || m="$m libdnnl-dev"
    have_zlib "$r" || have_zlib "" || m="$m zlib1g-dev"
    have_pc libcjson || m="$m libcjson-dev"
    have_pc cmocka || m="$m libcmocka-dev"
    have_pc libturbojpeg || m="$m libturbojpeg0-dev"
    have_pc libjpeg || m="$m libjpeg62-turbo-dev"
    [ -n "$STB_DIR" ] || m="$m libstb-dev"
    command -v pkg-config >/dev/null 2>&1 || m="$m pkgconf"
    echo "$m"
}
STB_DIR=""
[ -f /usr/include/stb/stb_image.h ] && STB_DIR=/usr/include
MISSING=$(missing_now "")
DEPS_NOTE="the system's packages"
# MGT_GPU_CHECK_USE_DEBS=1 takes the carried .debs even where the system has the packages, to
# try that path on a machine that has them.
if [ -n "$MISSING" ] || [ "${MGT_GPU_CHECK_USE_DEBS:-0}" = 1 ]; then
    DEBS=$(ls "$REPO"/.gpu-deps/*.deb 2>/dev/null)
    if [ -n "$DEBS" ]; then
        # Beside the build folder, not in a temporary one: the CMake cache keeps its paths.
        # dpkg-deb -x into a private prefix: nothing is installed into /, no root needed.
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
        export PKG_CONFIG_PATH="$ML/pkgconfig:$ROOT/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
        # Now for the unpacked pkgconf, later for the build's links and the tests: libdnnl.so
        # needs the unpacked libOpenCL.so.1, which neither its nor our RUNPATH names.
        export LD_LIBRARY_PATH="$ML${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        if ! command -v pkg-config >/dev/null 2>&1 && [ -x "$ROOT/usr/bin/pkgconf" ]; then
            CMAKE_ARGS+=("-DPKG_CONFIG_EXECUTABLE=$ROOT/usr/bin/pkgconf")
            ln -sf pkgconf "$ROOT/usr/bin/pkg-config"
            export PATH="$ROOT/usr/bin:$PATH"
        fi
        [ -z "$STB_DIR" ] && [ -f "$ROOT/usr/include/stb/stb_image.h" ] && STB_DIR=$ROOT/usr/include
        DEPS_NOTE="$(echo "$DEBS" | wc -w) packages unpacked from .gpu-deps/ into $ROOT"
        MISSING=$(missing_now "$ROOT")
        have_dnnl "$ROOT" || have_dnnl ""
        have_zlib "$ROOT" || have_zlib ""
    else
        DEPS_NOTE="no .gpu-deps/ carried (make it here with tools/gpu-check.sh --fetch-deps)"
    fi
else
    have_dnnl ""
    have_zlib ""
fi
[ -n "$STB_DIR" ] && CMAKE_ARGS+=("-DSTB_INCLUDE_DIR=$STB_DIR")
[ -n "${ZLIB_INC:-}" ] && [ -n "${ZLIB_SO:-}" ] && CMAKE_ARGS+=("-DZLIB_INCLUDE_DIR=$ZLIB_INC" "-DZLIB_LIBRARY=$ZLIB_SO")
# Both given: find_path and find_library would not look again past a cached answer.
[ -n "${DNNL_INC:-}" ] && [ -n "${DNNL_SO:-}" ] && CMAKE_ARGS+=("-DDNNL_INCLUDE_DIR=$DNNL_INC" "-DDNNL_LIB=$DNNL_SO")
LIBDIRS=${LIBDIRS#:} # no empty entry: one would put the current folder on the search path
[ -n "$LIBDIRS" ] && export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GEN="Unix Makefiles"
command -v ninja >/dev/null 2>&1 && GEN=Ninja
CMAKE_ARGS+=(-G "$GEN")

fact cuda_toolkit "${CUDA_ROOT:-not found}"
fact cudnn "${CUDNN_SO:-not found}"
fact cublas "${CUBLAS_SO:-not found}"
fact nccl_found "${NCCL_SO:-not found}"
fact packages "$DEPS_NOTE; missing:${MISSING:- nothing}"

log "started $(date -u +%Y-%m-%dT%H:%M:%SZ) in $REPO; output in $OUT; ${TOTAL_BUDGET}s in all${STOP_AFTER:+; stopping after $STOP_AFTER}"
run_stage preflight 30 preflight
PREFLIGHT_RC=$STAGE_RC
GPU_LINE=$(grep -E '^ *[0-9]+, ' "$STAGE_LOG" | head -n 1)
fact gpus "${GPU_LINE:-none seen by nvidia-smi}"
stop_here preflight && { VERDICT=1; exit; }

# ==== probe: does CUDA open? Seconds, before minutes of building ====

probe() {
    local links="" d
    for d in $(dirname "${CUDART_SO:-/nonexistent/x}") $(dirname "$CUDNN_SO") $(dirname "$CUBLAS_SO"); do
        links="$links -L$d -Wl,-rpath,$d"
    done
    # shellcheck disable=SC2086
    ${CC:-cc} -std=c11 -O1 -Wall -Wextra -o "$WORK/cuda_probe" "$REPO/src/device/cuda/probe/cuda_probe.c" \
        "$REPO/src/device/cuda/probe.c" -I"$REPO/src" -I"$CUDA_ROOT/include" \
        -I"$(dirname "$CUDNN_H")" -I"$(dirname "$CUBLAS_H")" $links \
        ${CUDART_SO:+"$CUDART_SO"} "$CUDNN_SO" "$CUBLAS_SO" || { echo "FAIL: the probe did not compile"; return 1; }
    "$WORK/cuda_probe"
}
if [ -n "$CUDA_ROOT" ] && [ -n "$CUDNN_SO" ] && [ -n "$CUBLAS_SO" ]; then
    run_stage probe 30 probe
    cp "$STAGE_LOG" "$PACK/probe.txt"
    PROBE_RC=$STAGE_RC
    fact versions "$(grep -m1 'cuda_probe: CUDA runtime' "$STAGE_LOG" | sed 's/^cuda_probe: //')"
else
    stage_done probe fail null 0 30 "not run: no CUDA toolkit, cuDNN or cuBLAS (preflight says which)"
    PROBE_RC=1
fi
if [ "$PROBE_RC" -ne 0 ] || [ "$PREFLIGHT_RC" -ne 0 ]; then
    log "stopping: nothing after this can run without $([ "$PROBE_RC" -ne 0 ] && echo "a CUDA device" || echo "the pieces preflight names")"
    VERDICT=1
    exit 1
fi
stop_here probe && { VERDICT=1; exit; }
export MGT_REQUIRE_CUDA=1

# ==== configure and build ====

# A build folder made by another generator cannot be reused, nor one configured against the
# other copy of the packages (system or unpacked): pkg-config's answers stay in its cache.
if [ -f "$BUILD/CMakeCache.txt" ]; then
    used_debs=0 cached_debs=0
    case "$DEPS_NOTE" in *unpacked*) used_debs=1 ;; esac
    grep -qF "$BUILD-deps/" "$BUILD/CMakeCache.txt" && cached_debs=1
    if ! grep -q "^CMAKE_GENERATOR:INTERNAL=$GEN\$" "$BUILD/CMakeCache.txt" || [ "$used_debs" != "$cached_debs" ]; then
        log "starting $BUILD afresh (another generator or other packages)"
        rm -rf "$BUILD"
    fi
fi
run_stage configure 45 cmake -S "$REPO" -B "$BUILD" "${CMAKE_ARGS[@]}"
fact nccl "$(grep -m1 'mgtrain: NCCL' "$STAGE_LOG" | sed 's/^-- mgtrain: //')"
log "$(grep -m1 'mgtrain: NCCL' "$STAGE_LOG" | sed 's/^-- //')"
[ "$STAGE_RC" -eq 0 ] || { VERDICT=1; exit 1; }
stop_here configure && { VERDICT=1; exit; }

run_stage build 200 cmake --build "$BUILD" -j "$(nproc)" --target mgtrain cuda_smoke test_conformance \
    test_models test_train
[ "$STAGE_RC" -eq 0 ] || { VERDICT=1; exit 1; }
{
    for b in "$BUILD/mgtrain" "$BUILD/cuda_smoke" "$BUILD/tests/test_conformance"; do
        echo "== ldd $b"
        ldd "$b" 2>&1
    done
} >"$PACK/machine/ldd.txt"
stop_here build && { VERDICT=1; exit; }

CTEST=(ctest --test-dir "$BUILD" --output-on-failure)
keep_ctest_logs() { # NAME: LastTest.log of the stage just run
    cp "$BUILD/Testing/Temporary/LastTest.log" "$PACK/junit/LastTest-$1.log" 2>/dev/null
}

# ==== correctness ====

run_stage smoke 25 "$BUILD/cuda_smoke"
no_cuda_skips smoke
stop_here smoke && { VERDICT=1; exit; }
run_stage smoke-sync 30 env MGT_CUDA_SYNC=1 "$BUILD/cuda_smoke"
no_cuda_skips smoke-sync
stop_here smoke-sync && { VERDICT=1; exit; }

run_stage conformance 75 "${CTEST[@]}" -L conformance -j 8 --output-junit "$PACK/junit/conformance.xml"
keep_ctest_logs conformance
no_cuda_skips conformance
check_cuda16 "$PACK/junit/LastTest-conformance.log" >"$PACK/stages/conformance-cuda16.txt" ||
    check_stage_failed conformance "$(grep -m1 FAIL "$PACK/stages/conformance-cuda16.txt")"
fact conformance "$(ctest_counts)"
FAILED_OPS=$(grep -oE 'conformance\.[a-z0-9_]+ \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)' "$STAGE_LOG" |
    sed -E 's/^conformance\.([a-z0-9_]+).*/\1/' | sort -u | head -n 6)
stop_here conformance && { VERDICT=1; exit; }

# A failed op again, pinned to its launch and under the memory checker, in this same run.
reruns() {
    local op sanitizer
    sanitizer=$(command -v compute-sanitizer || ls "$CUDA_ROOT"/bin/compute-sanitizer \
        "$CUDA_ROOT"/compute-sanitizer/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -n 1)
    if [ -z "$FAILED_OPS" ]; then
        echo "no conformance op failed: nothing to rerun"
        return 0
    fi
    for op in $FAILED_OPS; do
        echo "==== $op under MGT_CUDA_SYNC=1"
        timeout 20 env MGT_CUDA_SYNC=1 "$BUILD/tests/test_conformance" "$op" -v 2>&1 | tail -n 60
        if [ -n "$sanitizer" ]; then
            echo "==== $op under compute-sanitizer --tool memcheck"
            timeout 40 "$sanitizer" --tool memcheck --print-limit 20 "$BUILD/tests/test_conformance" "$op" 2>&1 | tail -n 80
        else
            echo "==== compute-sanitizer: not found"
        fi
    done
    return 1 # the ops failed; the reruns only say more about why
}
run_stage reruns 60 reruns
stop_here reruns && { VERDICT=1; exit; }

run_stage ctest-smoke 45 "${CTEST[@]}" -L smoke --output-junit "$PACK/junit/smoke.xml"
keep_ctest_logs ctest-smoke
no_cuda_skips ctest-smoke
stop_here ctest-smoke && { VERDICT=1; exit; }

run_stage models 50 env MGT_TEST_DEVICE=cuda "${CTEST[@]}" -R '^models$' --output-junit "$PACK/junit/models.xml"
keep_ctest_logs models
no_cuda_skips models
stop_here models && { VERDICT=1; exit; }

run_stage train-cuda 60 "${CTEST[@]}" -R '^train\.cuda$' --output-junit "$PACK/junit/train-cuda.xml"
keep_ctest_logs train-cuda
no_cuda_skips train-cuda
stop_here train-cuda && { VERDICT=1; exit; }

devices() {
    "$BUILD/mgtrain" devices --device cuda --gpus 0,0 && MGT_NO_P2P=1 "$BUILD/mgtrain" devices --device cuda --gpus 0,0
}
run_stage devices 20 devices
fact libraries "$(grep -m1 '^CUDA libraries:' "$STAGE_LOG" | sed 's/^CUDA libraries: //')"
stop_here devices && { VERDICT=1; exit; }

run_stage bytes 10 "$BUILD/mgtrain" model -a resnet50 --amp bf16 --bytes -b 256
stop_here bytes && { VERDICT=1; exit; }

# ==== training and benchmarks, last ====

train() {
    local common=(-a resnet20 --epochs 1 -b 64 -p 1 --seed 0 --deterministic)
    rm -f "$PACK/train-mock.jsonl" "$PACK/train-cuda.jsonl"
    "$BUILD/mgtrain" "$REPO/data/sample" "${common[@]}" --device cpu --gpus 0,1 \
        --log "$PACK/train-mock.jsonl" --checkpoint-dir "$WORK/ckpt-mock" || return 1
    "$BUILD/mgtrain" "$REPO/data/sample" "${common[@]}" --device cuda --gpus 0,0 \
        --log "$PACK/train-cuda.jsonl" --checkpoint-dir "$WORK/ckpt-cuda" || return 1
    compare_losses "$PACK/train-mock.jsonl" "$PACK/train-cuda.jsonl"
}
run_stage train 60 train
stop_here train && { VERDICT=1; exit; }

# A replica given up mid-step on CUDA: the survivors' streams, queued behind its events, must be
# let go (host-written marks) and skip its memory (guarded copy kernels). Four replicas share
# one GPU here, so each has a stream queue of its own (CUDA_DEVICE_MAX_CONNECTIONS=32): a hung
# replica's stream must not hold up a survivor's through a shared hardware queue, which
# separate GPUs never share. Kernel 300 of a replica falls in step 2 (about 130 a step).
survive() {
    # --deterministic: cuDNN's heuristic choice, no timed search at start-up
    local common=(-a resnet20 --epochs 1 -b 60 -p 1 --seed 0 --device cuda --gpus 0,0,0,0
        --deterministic --on-device-failure continue --device-timeout 5)
    local fault out rc
    for fault in hang@2:300 gone@1:400; do
        echo "==== MGT_CUDA_FAULT=$fault"
        out=$(env MGT_CUDA_FAULT="$fault" CUDA_DEVICE_MAX_CONNECTIONS=32 \
            timeout 28 "$BUILD/mgtrain" "$REPO/data/sample" "${common[@]}" 2>&1)
        rc=$?
        echo "$out"
        echo "exit $rc"
        [ "$rc" -eq 0 ] || return 1
        grep -q 'dropped: training goes on with 3 devices' <<<"$out" || { echo "FAIL: no replica dropped"; return 1; }
        grep -q '(300 validation images)' <<<"$out" || { echo "FAIL: the validation did not count 300 images"; return 1; }
        grep -q 'trained on 3 devices (1 lost' <<<"$out" || { echo "FAIL: the summary does not say 3 devices"; return 1; }
    done
}
run_stage survive 60 survive
stop_here survive && { VERDICT=1; exit; }

# shellcheck disable=SC2054 # 0,0 is one argument
BENCH=("$BUILD/mgtrain" bench --device cuda --gpus 0,0 -a resnet50 -b 32 --dummy --steps 5 --warmup 2)
run_stage bench 60 "${BENCH[@]}" --json "$PACK/bench.json"
stop_here bench && { VERDICT=1; exit; }
run_stage bench-ring 40 "${BENCH[@]}" --amp bf16 --grad-dtype bf16 --allreduce ring --json "$PACK/bench-ring.json"
# the benchmark ran the channels-last path: NHWC bf16 activations, and some of them
case "$(grep -m1 '^activations between ops:' "$STAGE_LOG")" in
*"NHWC bf16"*", 0 of "*) check_stage_failed bench-ring "no activation took the channels-last path" ;;
*"NHWC bf16"*) ;;
*) check_stage_failed bench-ring "its banner does not say NHWC bf16 activations" ;;
esac
stop_here bench-ring && { VERDICT=1; exit; }
# cuDNN 9's API log of one benchmark (every call with its arguments and status)
run_stage bench-det 40 env CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$PACK/cudnn-api.log" \
    "${BENCH[@]}" --deterministic --amp bf16 --json "$PACK/bench-det.json"

VERDICT=1
exit
