#!/usr/bin/env bash
# Multi-node runs under mpirun on this machine (ranks over shared memory): CTest runs one
# case per call, `test_mpi.sh CASE MGTRAIN DATA TMP HAVE_MPI`. Exit 77 (a skip, with the
# reason) where mpirun is missing or the build has no MPI.
set -uo pipefail
case_name=$1 mgtrain=$2 data=$3 tmp=$4/mpi-$1 have_mpi=$5
# a skip where the setup installs what is missing is a failure under the test command
# (MGT_TEST_REQUIRE_DEPS=1, scripts/test.sh)
skip() { if [ "${MGT_TEST_REQUIRE_DEPS:-}" = 1 ]; then echo "FAIL: $1"; exit 1; fi; echo "SKIP: $1"; exit 77; }
command -v mpirun >/dev/null || skip "mpirun is missing (scripts/setup.sh installs openmpi-bin)"
[ "$have_mpi" = ON ] || skip "this build has no MPI (cmake -DMGT_MPI=ON with libopenmpi-dev)"
rm -rf "$tmp" && mkdir -p "$tmp"
MPIRUN=(mpirun --oversubscribe --allow-run-as-root --mca btl self,vader)
# Open MPI leaves its own allocations (its dlopened components') at exit: leak reports under
# the address sanitizer would be its, not ours (the single-process tests keep leak checks)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
# and its buffers written by whichever thread polls MPI (see tsan.supp)
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS }suppressions=$(dirname "$0")/tsan.supp history_size=7"
# a small run: resnet20 on the committed sample (300 training, 300 validation images), 8
# images per device, batch norm live; one decode thread per process on this loaded machine
RUN=("$data" -a resnet20 --device cpu -b 32 --max-steps 3 -j 1 --seed 7)

# each run's bound (hang checks, not timings): generous, the sanitizers' runs on this loaded
# machine take minutes
T=${MGT_MPI_RUN_TIMEOUT:-240}

fail() { echo "FAIL: $*"; exit 1; }
val_line() { grep -a ' \* Acc@1' "$1" | tail -1; }

case $case_name in
equivalence)
    # 2 processes x 2 mock devices against 1 process x 4: the same bytes, the same validation
    timeout "$T" "$mgtrain" "${RUN[@]}" --gpus 0,1,2,3 --epochs 2 --checkpoint-dir "$tmp/one" >"$tmp/one.txt" 2>&1 ||
        fail "1x4: $(tail -3 "$tmp/one.txt")"
    timeout "$T" "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 2 --checkpoint-dir "$tmp/two" \
        >"$tmp/two.txt" 2>&1 || fail "2x2: $(tail -5 "$tmp/two.txt")"
    grep -q "world: 2 nodes x 2 devices = 4 replicas" "$tmp/two.txt" || fail "2x2 did not say its world"
    grep -q "8 per device x 4 devices = 32 per step" "$tmp/two.txt" || fail "2x2 did not say its batch"
    # what Ctrl-C on Open MPI's mpirun does (SIGTERM after 1 s, SIGKILL 1 s later): said
    grep -q "^=> Ctrl-C on mpirun: Open MPI sends every rank SIGTERM after 1 s and SIGKILL 1 s later" "$tmp/two.txt" ||
        fail "2x2 did not say what Ctrl-C on mpirun does to a checkpoint"
    [ "$(grep -c '(300 validation images)' "$tmp/two.txt")" = 2 ] ||
        fail "2x2 printed other than two validations of 300 images (only node 0 prints)"
    cmp "$tmp/one/checkpoint.safetensors" "$tmp/two/checkpoint.safetensors" ||
        fail "the 2x2 weights differ from the 1x4 weights"
    [ "$(val_line "$tmp/one.txt")" = "$(val_line "$tmp/two.txt")" ] ||
        fail "validation differs: 1x4 '$(val_line "$tmp/one.txt")', 2x2 '$(val_line "$tmp/two.txt")'"
    echo "2x2 = 1x4: $(val_line "$tmp/two.txt")"
    ;;
resume)
    # a 2x2 checkpoint goes on on 1x4 exactly as 1x4 would have, and on 1x2
    timeout "$T" "$mgtrain" "${RUN[@]}" --gpus 0,1,2,3 --epochs 2 --checkpoint-dir "$tmp/ref" >"$tmp/ref.txt" 2>&1 ||
        fail "1x4: $(tail -3 "$tmp/ref.txt")"
    timeout "$T" "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 1 --checkpoint-dir "$tmp/two" \
        >"$tmp/two.txt" 2>&1 || fail "2x2: $(tail -5 "$tmp/two.txt")"
    cp -r "$tmp/two" "$tmp/two_b"
    timeout "$T" "$mgtrain" "${RUN[@]}" --gpus 0,1,2,3 --epochs 2 --checkpoint-dir "$tmp/two" --resume auto \
        >"$tmp/on4.txt" 2>&1 || fail "resume on 1x4: $(tail -3 "$tmp/on4.txt")"
    grep -q "resumed from .* at epoch 1 step 0" "$tmp/on4.txt" || fail "1x4 did not resume at epoch 1"
    cmp "$tmp/ref/checkpoint.safetensors" "$tmp/two/checkpoint.safetensors" ||
        fail "2x2 then 1x4 differs from 1x4 throughout"
    timeout "$T" "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 2 --checkpoint-dir "$tmp/two_b" --resume auto \
        >"$tmp/on2.txt" 2>&1 || fail "resume on 1x2: $(tail -3 "$tmp/on2.txt")"
    grep -q "resumed from .* at epoch 1 step 0" "$tmp/on2.txt" || fail "1x2 did not resume at epoch 1"
    grep -q '(300 validation images)' "$tmp/on2.txt" || fail "1x2 did not validate"
    echo "resumed on 1x4 (bit-identical) and on 1x2"
    ;;
fault)
    # a kernel fault on device 1 of rank 1 ends both ranks within 10 s (timed from the first
    # progress line: start-up is slow under the sanitizers), with one line naming the node,
    # the device, the step and the cause
    "${MPIRUN[@]}" -np 1 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 3 --max-steps 1000000 --print-freq 1 : \
        -np 1 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 3 --max-steps 1000000 --print-freq 1 \
        --mock 'fault=kernel@1:400' >"$tmp/out.txt" 2>&1 &
    mp=$!
    for _ in $(seq 1 1200); do grep -q '^Epoch: \[0\]' "$tmp/out.txt" && break; kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    start=$(date +%s)
    for _ in $(seq 1 300); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    if kill -0 $mp 2>/dev/null; then
        pkill -9 -P $mp
        kill -9 $mp
        fail "both ranks still run 30 s after training started"
    fi
    wait $mp
    rc=$?
    took=$(($(date +%s) - start))
    [ $rc -ne 0 ] || fail "rc 0: $(tail -5 "$tmp/out.txt")"
    grep -q '^Epoch: \[0\]' "$tmp/out.txt" || fail "the fault came before training: $(grep '^mgtrain: ' "$tmp/out.txt")"
    [ $took -le 10 ] || fail "took ${took} s to end both ranks"
    [ "$(grep -c '^mgtrain: ' "$tmp/out.txt")" = 1 ] || fail "not one line: $(grep '^mgtrain: ' "$tmp/out.txt")"
    # the worker's words ("mock:1: epoch 0 step N (...): ...") or, where the device's
    # exchange with the other node failed first, the all-reduce's ("epoch 0 step N (the
    # all-reduce): device 1: ...: mock:1: ...")
    line=$(grep '^mgtrain: ' "$tmp/out.txt")
    case $line in
    "mgtrain: node 1 of 2 "*mock:1*) ;;
    *) fail "the line does not name node and device: $line" ;;
    esac
    case $line in
    *"epoch 0 step "*"injected fault"*) ;;
    *) fail "the line does not name step and cause: $line" ;;
    esac
    echo "ended within ${took} s of training's start: $(grep '^mgtrain: ' "$tmp/out.txt")"
    ;;
kill)
    # rank 1 SIGKILLed mid-training: rank 0 stops (mpirun's own reaction, or --timeout) and
    # nothing hangs
    "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 100 --max-steps 1000000 --timeout 5 \
        >"$tmp/out.txt" 2>&1 &
    mp=$!
    for _ in $(seq 1 1200); do grep -q '^Epoch: \[0\]' "$tmp/out.txt" && break; sleep 0.1; done
    grep -q '^Epoch: \[0\]' "$tmp/out.txt" || { kill $mp; fail "training did not start: $(tail -3 "$tmp/out.txt")"; }
    victim=
    for p in $(pgrep -P $mp); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && victim=$p
    done
    [ -n "$victim" ] || { kill $mp; fail "no rank 1 among mpirun's children"; }
    start=$(date +%s)
    kill -9 "$victim"
    for _ in $(seq 1 200); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    if kill -0 $mp 2>/dev/null; then
        kill -9 $mp
        fail "rank 0 still runs 20 s after rank 1 was killed"
    fi
    wait $mp
    rc=$?
    [ $rc -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
    echo "stopped $(($(date +%s) - start)) s after the kill, rc $rc"
    ;;
stall)
    # rank 1 stopped (SIGSTOP: alive, so mpirun does not react): rank 0 ends after --timeout
    # with a line saying so, and its MPI_Abort takes the stopped rank too
    "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 100 --max-steps 1000000 --timeout 3 \
        >"$tmp/out.txt" 2>&1 &
    mp=$!
    for _ in $(seq 1 1200); do grep -q '^Epoch: \[0\]' "$tmp/out.txt" && break; sleep 0.1; done
    grep -q '^Epoch: \[0\]' "$tmp/out.txt" || { kill $mp; fail "training did not start: $(tail -3 "$tmp/out.txt")"; }
    for p in $(pgrep -P $mp); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && kill -STOP "$p"
    done
    start=$(date +%s)
    for _ in $(seq 1 200); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    if kill -0 $mp 2>/dev/null; then
        pkill -9 -P $mp
        kill -9 $mp
        fail "still running 20 s after rank 1 stalled"
    fi
    wait $mp
    # the step timeout, or a wait of the main thread's (validation's totals) running out
    grep -q '^mgtrain: node 0 of 2 .*within --timeout 3 s' "$tmp/out.txt" ||
        fail "no timeout line: $(grep '^mgtrain' "$tmp/out.txt")"
    echo "ended $(($(date +%s) - start)) s after the stall: $(grep '^mgtrain' "$tmp/out.txt")"
    ;;
sigint)
    # SIGINT to the ranks, as a Ctrl-C on mpirun cannot give it (Open MPI 4.1's mpirun does not
    # forward SIGINT: it sends every rank SIGCONT, SIGTERM S s later and SIGKILL S s after that,
    # and exits 1 whatever the ranks return; S = 3 here, which node 0's Ctrl-C line must say):
    # the nodes agree on the step to stop at, node 0 saves, mpirun exits 130 as the ranks do,
    # and the checkpoint goes on (here on 1x4)
    "${MPIRUN[@]}" --mca odls_base_sigkill_timeout 3 -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 \
        --epochs 100 --max-steps 1000000 --print-freq 1 --checkpoint-dir "$tmp/ck" >"$tmp/out.txt" 2>&1 &
    mp=$!
    for _ in $(seq 1 1200); do grep -q '^Epoch: \[0\]\[ *3/' "$tmp/out.txt" && break; sleep 0.1; done
    grep -q '^Epoch: \[0\]' "$tmp/out.txt" || { kill $mp; fail "training did not start: $(tail -3 "$tmp/out.txt")"; }
    kill -INT $(pgrep -P $mp)
    for _ in $(seq 1 200); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    if kill -0 $mp 2>/dev/null; then
        pkill -9 -P $mp
        kill -9 $mp
        fail "still running 20 s after SIGINT"
    fi
    wait $mp
    rc=$?
    [ $rc = 130 ] || fail "exit status $rc after SIGINT, not 130: $(grep -a '^mgtrain\|^=> stopped' "$tmp/out.txt")"
    grep -q "^=> Ctrl-C on mpirun: Open MPI sends every rank SIGTERM after 3 s and SIGKILL 3 s later" "$tmp/out.txt" ||
        fail "the Ctrl-C line does not give mpirun's --mca value"
    # mid-epoch: the agreed step and its line (`=> stopped at epoch E step S`); a signal during
    # validation stops after the epoch's checkpoint, and the summary says `=> stopped:`
    grep -q '^=> stopped' "$tmp/out.txt" && [ -f "$tmp/ck/checkpoint.safetensors" ] ||
        fail "no stop with a checkpoint: $(grep -v '^Epoch\|^Test' "$tmp/out.txt" | tail -5)"
    timeout "$T" "$mgtrain" "${RUN[@]}" --gpus 0,1,2,3 --epochs 4 --checkpoint-dir "$tmp/ck" \
        --resume auto >"$tmp/resume.txt" 2>&1 || fail "resume: $(tail -3 "$tmp/resume.txt")"
    grep -q 'resumed from' "$tmp/resume.txt" || fail "did not resume: $(tail -3 "$tmp/resume.txt")"
    echo "$(grep '^=> stopped' "$tmp/out.txt"); resumed on 1x4"
    ;;
disagree)
    # ranks started with different settings: one line naming the first that differs and both
    # values, from the node that differs, and no hang (before: --max-steps 4 against 8 hung
    # without --timeout, resnet20 against resnet32 died in MPI_ERR_TRUNCATE, -b 32 against 64
    # trained on without a word)
    for pair in "--max-steps 4|--max-steps 8|--max-steps: 8 on node 1, 4 on node 0" \
        "-a resnet20|-a resnet32|--arch: resnet32 on node 1, resnet20 on node 0" \
        "-b 32|-b 64|-b: 64 on node 1, 32 on node 0"; do
        IFS='|' read -r a b want <<<"$pair"
        # shellcheck disable=SC2086
        timeout 120 "${MPIRUN[@]}" -np 1 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 1 $a : \
            -np 1 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 1 $b >"$tmp/out.txt" 2>&1
        rc=$?
        [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$a against $b: rc $rc: $(tail -3 "$tmp/out.txt")"
        [ "$(grep -ac '^mgtrain: ' "$tmp/out.txt")" = 1 ] ||
            fail "$a against $b: not one line: $(grep -a '^mgtrain' "$tmp/out.txt")"
        grep -aq "^mgtrain: node 1 of 2 .*the nodes disagree on $want" "$tmp/out.txt" ||
            fail "$a against $b: $(grep -a '^mgtrain' "$tmp/out.txt")"
        grep -a '^mgtrain: ' "$tmp/out.txt"
    done
    ;;
fault_both)
    # the same kernel fault on both ranks: each prints its own line (before: each saw the
    # other's message and took the failure for the other's, and no mgtrain line was printed)
    timeout 120 "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 1 \
        --mock 'fault=kernel@1:100' >"$tmp/out.txt" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "rc $rc: $(tail -3 "$tmp/out.txt")"
    for n in 0 1; do
        grep -aq "^mgtrain: node $n of 2 .*mock:1: epoch 0 step 0 (backward): injected fault" "$tmp/out.txt" ||
            fail "no line from node $n: $(grep -a '^mgtrain' "$tmp/out.txt")"
    done
    grep -a '^mgtrain: ' "$tmp/out.txt"
    ;;
bench)
    # bench allreduce across 2 ranks: a row per size with both variants, the model beside them
    timeout "$T" "${MPIRUN[@]}" -np 2 "$mgtrain" bench allreduce --device cpu --gpus 0,1 \
        --mock 'link=25GB/s,10us;xlink=1GB/s,20us' --min-bytes 64K --max-bytes 256K \
        --json "$tmp/b.json" >"$tmp/out.txt" 2>&1 || fail "bench: $(tail -5 "$tmp/out.txt")"
    grep -q '2 nodes x 2 mock devices = 4' "$tmp/out.txt" || fail "no world line: $(head -3 "$tmp/out.txt")"
    [ "$(grep -cE '^ +(65536|131072|262144) \|' "$tmp/out.txt")" = 3 ] || fail "not 3 rows: $(cat "$tmp/out.txt")"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["results"]; assert d["nodes"]==2 and d["devices"]==4 and len(r)==3 and all(x["hier"]["time_s"]>0 and x["flat"]["model_s"]>0 for x in r)' \
        "$tmp/b.json" || fail "bad --json: $(cat "$tmp/b.json")"
    echo "$(grep -E '^ +262144' "$tmp/out.txt")"
    # the training step across 2 ranks: rows of 1 and 2 devices per node, the world's rate
    timeout "$T" "${MPIRUN[@]}" -np 2 "$mgtrain" bench --device cpu --gpus 0,1 --mock threads=1 \
        -a resnet20 -b 8 --dummy --image-size 28 --in-channels 1 --classes 10 --steps 2 --warmup 1 \
        --json "$tmp/t.json" >"$tmp/train.txt" 2>&1 || fail "bench: $(tail -5 "$tmp/train.txt")"
    grep -q '^world: 2 nodes' "$tmp/train.txt" || fail "no world line: $(head -4 "$tmp/train.txt")"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["results"]; assert d["nodes"]==2 and [x["devices"] for x in r]==[1,2] and all(x["images_per_s"]>0 for x in r) and abs(r[0]["speedup"]-2)<1e-9' \
        "$tmp/t.json" || fail "bad bench --json: $(cat "$tmp/t.json")"
    ;;
bad_env)
    # nodes with different local device counts, and --grad-dtype bf16 across nodes: clear
    # errors, no hang
    timeout 60 "${MPIRUN[@]}" -np 1 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 1 : \
        -np 1 "$mgtrain" "${RUN[@]}" --gpus 0 --epochs 1 >"$tmp/out.txt" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "rc $rc: $(tail -5 "$tmp/out.txt")"
    grep -q 'node 1 has 1 devices but node 0 has 2: every node must use the same local device count' \
        "$tmp/out.txt" || fail "no clear error: $(grep mgtrain "$tmp/out.txt")"
    echo "$(grep -m1 'node 1 has' "$tmp/out.txt")"
    # --grad-dtype bf16 is for one node: across processes a one-line refusal, no hang
    timeout 60 "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0 --epochs 1 --grad-dtype bf16 \
        >"$tmp/bf16.txt" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "--grad-dtype bf16 across ranks: rc $rc"
    grep -q 'grad-dtype bf16: the compressed all-reduce is for one node' "$tmp/bf16.txt" ||
        fail "no clear --grad-dtype error: $(grep mgtrain "$tmp/bf16.txt")"
    echo "$(grep -m1 'compressed all-reduce is for one node' "$tmp/bf16.txt")"
    ;;
*)
    fail "unknown case $case_name"
    ;;
esac
