#!/usr/bin/env bash
# tools/gpu-check.sh on a machine without a GPU: the dry run must stop at its probe with the CUDA runtime's own reason, exit non-zero and leave its archive; and the train stage's loss comparison must pass two runs that differ only in float rounding and fail a changed one.
#
#   test_gpu_check.sh dry_run REPO OUT
#   test_gpu_check.sh compare_losses REPO OUT MGTRAIN
# Exit 0 pass, 1 fail, 77 skipped (said why).
set -u
case_name=$1 repo=$2 out=$3
fail() {
    echo "FAIL: $*"
    exit 1
}
rm -rf "$out"
mkdir -p "$out"

case $case_name in
dry_run)
    # about 3 s: the probe is compiled from two files and run before any configure or build
    if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
        echo "skipped: no CUDA toolkit here, so the script stops before its probe"
        exit 77
    fi
    OUT="$out/run" MGT_GPU_CHECK_BUILD="$out/build-gpu" bash "$repo/tools/gpu-check.sh" \
        --stop-after probe >"$out/stdout.txt" 2>&1
    rc=$?
    cat "$out/stdout.txt"
    if [ "$rc" -eq 0 ]; then
        echo "skipped: a CUDA device answers here; the dry run is for machines without one"
        exit 77
    fi
    last=$(tail -n 1 "$out/stdout.txt")
    case "$last" in
    *"no CUDA device"* | *cudaGetDeviceCount*) ;;
    *) fail "the last line does not give the reason: $last" ;;
    esac
    [ -f "$out/run/gpu-check.tar.gz" ] || fail "no archive in $out/run"
    tar -tzf "$out/run/gpu-check.tar.gz" >"$out/list.txt" || fail "the archive does not open"
    for f in gpu-check/gpu-check.log gpu-check/summary.json gpu-check/probe.txt \
        gpu-check/stages/01-preflight.log gpu-check/stages/02-probe.log; do
        grep -qx "$f" "$out/list.txt" || fail "the archive lacks $f"
    done
    grep -q '"result": "fail"' "$out/run/summary.json" || fail "summary.json does not say fail"
    grep -q '"name": "probe", "status": "fail"' "$out/run/summary.json" ||
        fail "summary.json does not name the probe as failed"
    grep -q '"name": "configure"' "$out/run/summary.json" && fail "it went on to configure"
    [ -e "$out/build-gpu" ] && fail "it made a build folder"
    echo "dry run: exit $rc, stopped at the probe, archive with $(wc -l <"$out/list.txt") entries"
    ;;
compare_losses)
    # about 4 s: two one-epoch runs of resnet20 on data/sample, 2 mock devices, whose
    # convolutions differ only in summation order (oneDNN's, im2col + gemm)
    mgtrain=$4
    for m in "conv=onednn" "conv=im2col;layout=nchw"; do
        "$mgtrain" "$repo/data/sample" -a resnet20 --epochs 1 -b 64 -p 1 --seed 0 --deterministic \
            --device cpu --gpus 0,1 --mock "threads=1;$m" --log "$out/${m%%;*}.jsonl" \
            >"$out/${m%%;*}.out" 2>&1 || fail "mgtrain --mock '$m': $(tail -n 1 "$out/${m%%;*}.out")"
    done
    bash "$repo/tools/gpu-check.sh" --compare-losses "$out/conv=onednn.jsonl" "$out/conv=im2col.jsonl" ||
        fail "two runs that differ only in rounding were told apart"
    # the fourth step's loss 5% off: a wrong kernel's kind of difference
    awk 'BEGIN { n = 0 } /"type":"train"/ { if (n++ == 3) { match($0, /"loss":[-0-9.e+]+/); v = substr($0, RSTART + 7, RLENGTH - 7) * 1.05; $0 = substr($0, 1, RSTART + 6) v substr($0, RSTART + RLENGTH) } } { print }' \
        "$out/conv=onednn.jsonl" >"$out/changed.jsonl"
    if bash "$repo/tools/gpu-check.sh" --compare-losses "$out/conv=onednn.jsonl" "$out/changed.jsonl"; then
        fail "a loss 5% off at the fourth step passed"
    fi
    head -n 3 "$out/conv=onednn.jsonl" | grep -v '"type":"train"' >"$out/short.jsonl"
    if bash "$repo/tools/gpu-check.sh" --compare-losses "$out/conv=onednn.jsonl" "$out/short.jsonl"; then
        fail "a log without training steps passed"
    fi
    echo "compare-losses: rounding passes, a 5% change and a missing log fail"
    ;;
*) fail "unknown case '$case_name'" ;;
esac
