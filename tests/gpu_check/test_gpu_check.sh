#!/usr/bin/env bash
# tools/gpu-check.sh on a machine without a GPU: the dry run must stop at its probe with the CUDA runtime's own reason, exit non-zero and leave its archive; the train stage's loss comparison must pass two runs that differ only in float rounding and fail a changed one; and the conformance stage's check that CUDA compared the NHWC 16-bit cases must tell such a run from one without CUDA.
#
#   test_gpu_check.sh dry_run REPO OUT
#   test_gpu_check.sh compare_losses REPO OUT MGTRAIN
#   test_gpu_check.sh check_cuda16 REPO OUT TEST_CONFORMANCE
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
check_cuda16)
    # under 1 s: the conformance stage's proof that CUDA compared the NHWC 16-bit cases must
    # pass a log where it did, and fail this machine's own (no GPU: mock devices only), one
    # with an op that compared no NHWC case, and one without an op's line
    conformance=$4
    good="$out/good.log"
    for op in conv2d_forward conv2d_backward_data conv2d_backward_filter batchnorm_forward_train \
        batchnorm_forward_eval batchnorm_backward maxpool2d_forward maxpool2d_backward \
        avgpool_forward avgpool_backward adaptive_avgpool_forward adaptive_avgpool_backward \
        channel_bias_forward channel_bias_backward channel_scale_forward channel_scale_backward \
        dropout layernorm_channels_forward layernorm_channels_backward; do
        echo "conformance $op: 40 cases (26 of them with 16-bit activations, 12 NHWC) on 3 backends: ok"
    done >"$good"
    bash "$repo/tools/gpu-check.sh" --check-cuda16 "$good" >"$out/good.txt" ||
        fail "a log where CUDA compared every NHWC case failed: $(grep -m1 FAIL "$out/good.txt")"
    "$conformance" avgpool_forward >"$out/here.log" 2>&1 || fail "test_conformance avgpool_forward failed"
    sed '/^conformance avgpool_forward: /d' "$good" >"$out/mixed.log"
    cat "$out/here.log" >>"$out/mixed.log"
    bash "$repo/tools/gpu-check.sh" --check-cuda16 "$out/mixed.log" >/dev/null &&
        fail "a run without CUDA passed: $(grep '^conformance avgpool_forward' "$out/here.log")"
    sed 's/^\(conformance maxpool2d_forward: .*\) 12 NHWC)/\1 0 NHWC)/' "$good" >"$out/none.log"
    bash "$repo/tools/gpu-check.sh" --check-cuda16 "$out/none.log" >/dev/null &&
        fail "an op with no NHWC case passed"
    sed '/^conformance batchnorm_backward: /d' "$good" >"$out/short.log"
    bash "$repo/tools/gpu-check.sh" --check-cuda16 "$out/short.log" >/dev/null &&
        fail "a log without batchnorm_backward's line passed"
    echo "check-cuda16: CUDA's NHWC cases pass; mock-only, no NHWC case and a missing op fail"
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
