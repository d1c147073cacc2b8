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
# the bounds on time below (--timeout, how soon a failure ends every rank, how long a start may
# take) are a machine's at full speed; a sanitizer's build runs slower and its CTest sets
# MGT_TEST_TIME_SCALE (tests/CMakeLists.txt) so that they are its multiples: a TSan run then
# tests races, not the scheduler
S=${MGT_TEST_TIME_SCALE:-1}
[[ $S =~ ^[1-9][0-9]*$ ]] || { echo "FAIL: MGT_TEST_TIME_SCALE '$S' is not a whole number of 1 or more"; exit 1; }
# secs N: N seconds of a full-speed machine, scaled
secs() { echo $(($1 * S)); }
# polls N: the 0.1 s polls in N seconds, scaled
polls() { seq 1 $(($1 * 10 * S)); }

fail() { echo "FAIL: $*"; exit 1; }
val_line() { grep -a ' \* Acc@1' "$1" | tail -1; }
# long_run NP TIMEOUT ARGS...: a training that would run for hours (--timeout TIMEOUT, scaled),
# started under mpirun in the background (mp: mpirun's pid, output in out.txt), returned to once
# its first progress line is out
long_run() {
    local np=$1 t=$2
    shift 2
    "${MPIRUN[@]}" -np "$np" "$mgtrain" "${RUN[@]}" "$@" --epochs 100 --max-steps 1000000 --timeout "$(secs "$t")" \
        >"$tmp/out.txt" 2>&1 &
    mp=$!
    for _ in $(polls 120); do grep -q '^Epoch: \[0\]' "$tmp/out.txt" && break; kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    grep -q '^Epoch: \[0\]' "$tmp/out.txt" ||
        { kill $mp 2>/dev/null; fail "training did not start: $(grep -a '^mgtrain' "$tmp/out.txt" || tail -3 "$tmp/out.txt")"; }
}
# rank_pids R: the pid of rank R among mpirun's children
rank_pids() {
    for p in $(pgrep -P $mp); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=$1 && echo "$p"
    done
}
# end_within_20s WHAT: mpirun's status once it has ended, or a failure (WHAT) after 20 s (scaled)
end_within_20s() {
    for _ in $(polls 20); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    if kill -0 $mp 2>/dev/null; then
        pkill -9 -P $mp
        kill -9 $mp
        fail "$1"
    fi
    wait $mp
}

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
    # auto takes the all-gather at 2 nodes and says why; the reduce-scatter gives the same bytes
    grep -q "=> node exchange: all-gather for every bucket .*at 2 nodes" "$tmp/two.txt" ||
        fail "2x2 did not say its exchange: $(grep 'node exchange' "$tmp/two.txt")"
    timeout "$T" "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 2 --checkpoint-dir "$tmp/two_rs" \
        --node-exchange reduce-scatter >"$tmp/two_rs.txt" 2>&1 || fail "2x2 reduce-scatter: $(tail -5 "$tmp/two_rs.txt")"
    cmp "$tmp/one/checkpoint.safetensors" "$tmp/two_rs/checkpoint.safetensors" ||
        fail "the 2x2 weights with --node-exchange reduce-scatter differ from the 1x4 weights"
    echo "2x2 = 1x4 with either exchange: $(val_line "$tmp/two.txt")"
    ;;
equivalence4)
    # 4 processes x 1 mock device against 1 x 4, with either exchange across the nodes; one
    # compute thread per device on both sides (mock kernels split work by thread count)
    R=("${RUN[@]}" --epochs 2 --mock threads=1)
    timeout "$T" "$mgtrain" "${R[@]}" --gpus 0,1,2,3 --checkpoint-dir "$tmp/one" >"$tmp/one.txt" 2>&1 ||
        fail "1x4: $(tail -3 "$tmp/one.txt")"
    for x in reduce-scatter allgather; do
        timeout "$T" "${MPIRUN[@]}" -np 4 "$mgtrain" "${R[@]}" --gpus 0 --node-exchange $x \
            --checkpoint-dir "$tmp/$x" >"$tmp/$x.txt" 2>&1 || fail "4x1 $x: $(tail -5 "$tmp/$x.txt")"
        grep -q "world: 4 nodes x 1 devices = 4 replicas" "$tmp/$x.txt" || fail "4x1 did not say its world"
        grep -q "=> node exchange: .*(--node-exchange $x)" "$tmp/$x.txt" ||
            fail "4x1 did not say its exchange: $(grep 'node exchange' "$tmp/$x.txt")"
        cmp "$tmp/one/checkpoint.safetensors" "$tmp/$x/checkpoint.safetensors" ||
            fail "the 4x1 weights ($x) differ from the 1x4 weights"
        [ "$(val_line "$tmp/one.txt")" = "$(val_line "$tmp/$x.txt")" ] || fail "validation differs ($x)"
    done
    echo "4x1 = 1x4 with either exchange: $(val_line "$tmp/one.txt")"
    ;;
equivalence3)
    # the rule for 3 nodes: with a power-of-two device count per node (1, 2) N x L = 1 x NL,
    # so 3 x 1 = 1 x 3 (pieces of unequal length) and 3 x 2 = 1 x 6; with 3 devices a node the
    # single-process tree pairs devices across nodes, so 2 x 3 gives its own bytes, the same
    # with either exchange, not 1 x 6's
    R=("${RUN[@]}" --epochs 1 -b 48 --mock threads=1)
    for g in 0,1,2 0,1,2,3,4,5; do
        timeout "$T" "$mgtrain" "${R[@]}" --gpus $g --checkpoint-dir "$tmp/one$g" >"$tmp/one$g.txt" 2>&1 ||
            fail "1 x $g: $(tail -3 "$tmp/one$g.txt")"
    done
    timeout "$T" "${MPIRUN[@]}" -np 3 "$mgtrain" "${R[@]}" --gpus 0 --node-exchange reduce-scatter \
        --checkpoint-dir "$tmp/3x1" >"$tmp/3x1.txt" 2>&1 || fail "3x1: $(tail -5 "$tmp/3x1.txt")"
    cmp "$tmp/one0,1,2/checkpoint.safetensors" "$tmp/3x1/checkpoint.safetensors" || fail "3x1 differs from 1x3"
    timeout "$T" "${MPIRUN[@]}" -np 3 "$mgtrain" "${R[@]}" --gpus 0,1 \
        --checkpoint-dir "$tmp/3x2" >"$tmp/3x2.txt" 2>&1 || fail "3x2: $(tail -5 "$tmp/3x2.txt")"
    grep -q "=> node exchange: reduce-scatter + all-gather for " "$tmp/3x2.txt" ||
        fail "3x2 auto took no reduce-scatter: $(grep 'node exchange' "$tmp/3x2.txt")"
    cmp "$tmp/one0,1,2,3,4,5/checkpoint.safetensors" "$tmp/3x2/checkpoint.safetensors" || fail "3x2 differs from 1x6"
    for x in reduce-scatter allgather; do
        timeout "$T" "${MPIRUN[@]}" -np 2 "$mgtrain" "${R[@]}" --gpus 0,1,2 --node-exchange $x \
            --checkpoint-dir "$tmp/2x3$x" >"$tmp/2x3$x.txt" 2>&1 || fail "2x3 $x: $(tail -5 "$tmp/2x3$x.txt")"
    done
    cmp "$tmp/2x3reduce-scatter/checkpoint.safetensors" "$tmp/2x3allgather/checkpoint.safetensors" ||
        fail "2x3 differs between the exchanges"
    ! cmp -s "$tmp/one0,1,2,3,4,5/checkpoint.safetensors" "$tmp/2x3allgather/checkpoint.safetensors" ||
        fail "2x3 gave 1x6's bytes: the documented rule (mgt/comm.h, README) says it does not"
    echo "3x1 = 1x3, 3x2 = 1x6; 2x3 the same with either exchange, not 1x6"
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
fault | fault4)
    # a kernel fault on one rank's device ends every rank within 10 s (scaled; timed from the first
    # progress line: start-up is slow under the sanitizers), with one line naming the node,
    # the device, the step and the cause: device 1 of rank 1 of 2 (2 devices each), or device
    # 0 of rank 3 of 4 (1 device each, the reduce-scatter across the nodes)
    if [ "$case_name" = fault ]; then # with continue: a lost device still ends the run
        np=2 victim=1 dev=1 G=(--gpus 0,1 --on-device-failure continue)
    else
        np=4 victim=3 dev=0 G=(--gpus 0 --node-exchange reduce-scatter)
    fi
    R=("${RUN[@]}" "${G[@]}" --epochs 3 --max-steps 1000000 --print-freq 1)
    launch=()
    [ $victim -gt 0 ] && launch+=(-np $victim "$mgtrain" "${R[@]}" :)
    launch+=(-np 1 "$mgtrain" "${R[@]}" --mock "fault=kernel@$dev:400")
    [ $((np - victim - 1)) -gt 0 ] && launch+=(: -np $((np - victim - 1)) "$mgtrain" "${R[@]}")
    "${MPIRUN[@]}" "${launch[@]}" >"$tmp/out.txt" 2>&1 &
    mp=$!
    for _ in $(polls 120); do grep -q '^Epoch: \[0\]' "$tmp/out.txt" && break; kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    start=$(date +%s)
    for _ in $(polls 30); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    if kill -0 $mp 2>/dev/null; then
        pkill -9 -P $mp
        kill -9 $mp
        fail "the ranks still run $(secs 30) s after training started"
    fi
    wait $mp
    rc=$?
    took=$(($(date +%s) - start))
    [ $rc -ne 0 ] || fail "rc 0: $(tail -5 "$tmp/out.txt")"
    grep -q '^Epoch: \[0\]' "$tmp/out.txt" || fail "the fault came before training: $(grep '^mgtrain: ' "$tmp/out.txt")"
    [ $took -le "$(secs 10)" ] || fail "took ${took} s to end every rank"
    [ "$(grep -c '^mgtrain: ' "$tmp/out.txt")" = 1 ] || fail "not one line: $(grep '^mgtrain: ' "$tmp/out.txt")"
    # the worker's words ("mock:1: epoch 0 step N (...): ...") or, where the device's
    # exchange with the other node failed first, the all-reduce's ("epoch 0 step N (the
    # all-reduce): device 1: ...: mock:1: ...")
    line=$(grep '^mgtrain: ' "$tmp/out.txt")
    case $line in
    "mgtrain: node $victim of $np "*mock:$dev*) ;;
    *) fail "the line does not name node and device: $line" ;;
    esac
    case $line in
    *"epoch 0 step "*"injected fault"*) ;;
    *) fail "the line does not name step and cause: $line" ;;
    esac
    if [ "$case_name" = fault ]; then
        case $line in
        *"; --on-device-failure continue ends a multi-node run at a lost device (every node must keep the same device count)") ;;
        *) fail "the line does not say why continue does not go on: $line" ;;
        esac
    fi
    echo "ended within ${took} s of training's start: $(grep '^mgtrain: ' "$tmp/out.txt")"
    ;;
kill | kill4)
    # a rank SIGKILLed mid-training: the others stop (mpirun's own reaction, or --timeout) and
    # nothing hangs; rank 1 of 2, or rank 0 of 4 with the reduce-scatter across the nodes
    if [ "$case_name" = kill ]; then
        np=2 victim=1 G=(--gpus 0,1)
    else
        np=4 victim=0 G=(--gpus 0 --node-exchange reduce-scatter)
    fi
    long_run $np 5 "${G[@]}"
    pid=$(rank_pids $victim)
    [ -n "$pid" ] || { kill $mp; fail "no rank $victim among mpirun's children"; }
    start=$(date +%s)
    kill -9 "$pid"
    end_within_20s "the other ranks still run $(secs 20) s after rank $victim was killed"
    rc=$?
    [ $rc -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
    echo "stopped $(($(date +%s) - start)) s after the kill of rank $victim of $np, rc $rc"
    ;;
stall | stall4)
    # a rank stopped (SIGSTOP: alive, so mpirun does not react): the others end after --timeout
    # with a line saying so, and MPI_Abort takes the stopped rank too; rank 1 of 2, or rank 2
    # of 4 with the reduce-scatter across the nodes
    if [ "$case_name" = stall ]; then
        np=2 victim=1 G=(--gpus 0,1)
    else
        np=4 victim=2 G=(--gpus 0 --node-exchange reduce-scatter)
    fi
    long_run $np 3 "${G[@]}"
    for p in $(rank_pids $victim); do kill -STOP "$p"; done
    start=$(date +%s)
    end_within_20s "still running $(secs 20) s after rank $victim stalled"
    # the step timeout, or a wait of the main thread's (validation's totals) running out, on
    # a rank other than the stalled one (which mpirun's kill may wake long enough to time out
    # too: it sends SIGCONT before its SIGTERM and SIGKILL)
    grep -E "^mgtrain: node [0-9]+ of $np .*within --timeout $(secs 3) s" "$tmp/out.txt" |
        grep -qv "^mgtrain: node $victim of " || fail "no timeout line: $(grep '^mgtrain' "$tmp/out.txt")"
    echo "ended $(($(date +%s) - start)) s after the stall of rank $victim of $np: $(grep '^mgtrain' "$tmp/out.txt" | head -1)"
    ;;
sigint)
    # SIGINT to the ranks, as a Ctrl-C on mpirun cannot give it (Open MPI 4.1's mpirun does not
    # forward SIGINT: it sends every rank SIGCONT, SIGTERM G s later and SIGKILL G s after that,
    # and exits 1 whatever the ranks return; G = 3 here, scaled, which node 0's Ctrl-C line must
    # say):
    # the nodes agree on the step to stop at, node 0 saves, mpirun exits 130 as the ranks do,
    # and the checkpoint goes on (here on 1x4)
    "${MPIRUN[@]}" --mca odls_base_sigkill_timeout "$(secs 3)" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 \
        --epochs 100 --max-steps 1000000 --print-freq 1 --checkpoint-dir "$tmp/ck" >"$tmp/out.txt" 2>&1 &
    mp=$!
    for _ in $(polls 120); do grep -q '^Epoch: \[0\]\[ *3/' "$tmp/out.txt" && break; sleep 0.1; done
    grep -q '^Epoch: \[0\]' "$tmp/out.txt" || { kill $mp; fail "training did not start: $(tail -3 "$tmp/out.txt")"; }
    kill -INT $(pgrep -P $mp)
    for _ in $(polls 20); do kill -0 $mp 2>/dev/null || break; sleep 0.1; done
    if kill -0 $mp 2>/dev/null; then
        pkill -9 -P $mp
        kill -9 $mp
        fail "still running $(secs 20) s after SIGINT"
    fi
    wait $mp
    rc=$?
    [ $rc = 130 ] || fail "exit status $rc after SIGINT, not 130: $(grep -a '^mgtrain\|^=> stopped' "$tmp/out.txt")"
    grep -q "^=> Ctrl-C on mpirun: Open MPI sends every rank SIGTERM after $(secs 3) s and SIGKILL $(secs 3) s later" "$tmp/out.txt" ||
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
        timeout "$(secs 120)" "${MPIRUN[@]}" -np 1 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 1 $a : \
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
    timeout "$(secs 120)" "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 1 \
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
    # bench allreduce across 2 ranks: a row per size with both exchanges, the model and the
    # ring's bound beside them
    timeout "$T" "${MPIRUN[@]}" -np 2 "$mgtrain" bench allreduce --device cpu --gpus 0,1 \
        --mock 'link=25GB/s,10us;xlink=1GB/s,20us' --min-bytes 64K --max-bytes 256K \
        --json "$tmp/b.json" >"$tmp/out.txt" 2>&1 || fail "bench: $(tail -5 "$tmp/out.txt")"
    grep -q '2 nodes x 2 mock devices = 4' "$tmp/out.txt" || fail "no world line: $(head -3 "$tmp/out.txt")"
    [ "$(grep -cE '^ +(65536|131072|262144) \|' "$tmp/out.txt")" = 3 ] || fail "not 3 rows: $(cat "$tmp/out.txt")"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["results"]; assert d["nodes"]==2 and d["devices"]==4 and len(r)==3 and all(x["allgather"]["time_s"]>0 and x["reduce_scatter"]["model_s"]>0 and 0<x["ring_model_s"]<=x["reduce_scatter"]["model_s"] for x in r)' \
        "$tmp/b.json" || fail "bad --json: $(cat "$tmp/b.json")"
    echo "$(grep -E '^ +262144' "$tmp/out.txt")"
    # the model table alone (one process): a small model's measured step, three node counts;
    # the new exchange at most today's, and a ring's time from 8 nodes on (at 2 the all-gather's
    # one latency beats the ring's two)
    timeout "$T" "$mgtrain" bench allreduce --device cpu --gpus 0 --mock 'xlink=1GB/s,20us' \
        --model-nodes 2,8,64 --model-arch resnet20 --model-batch 4 --json "$tmp/m.json" \
        >"$tmp/model.txt" 2>&1 || fail "bench --model-nodes: $(tail -5 "$tmp/model.txt")"
    python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["model"]; r=m["rows"]; assert m["arch"]=="resnet20" and m["backward_s"]>0 and [x["nodes"] for x in r]==[2,8,64] and all(x["new"]["allreduce_s"]<=x["allgather"]["allreduce_s"] and x["new"]["step_s"]<=x["allgather"]["step_s"] for x in r) and all(x["ring"]["allreduce_s"]<=x["new"]["allreduce_s"] for x in r[1:]) and r[2]["allgather"]["allreduce_s"]>5*r[2]["new"]["allreduce_s"]' \
        "$tmp/m.json" || fail "bad model table: $(cat "$tmp/model.txt")"
    grep -E '^ +64 \|' "$tmp/model.txt"
    # the training step across 2 ranks: rows of 1 and 2 devices per node, the world's rate
    timeout "$T" "${MPIRUN[@]}" -np 2 "$mgtrain" bench --device cpu --gpus 0,1 --mock threads=1 \
        -a resnet20 -b 8 --dummy --image-size 28 --in-channels 1 --classes 10 --steps 2 --warmup 1 \
        --json "$tmp/t.json" >"$tmp/train.txt" 2>&1 || fail "bench: $(tail -5 "$tmp/train.txt")"
    grep -q '^world: 2 nodes' "$tmp/train.txt" || fail "no world line: $(head -4 "$tmp/train.txt")"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); r=d["results"]; assert d["nodes"]==2 and [x["devices"] for x in r]==[1,2] and all(x["images_per_s"]>0 for x in r) and abs(r[0]["speedup"]-2)<1e-9' \
        "$tmp/t.json" || fail "bad bench --json: $(cat "$tmp/t.json")"
    ;;
bytes)
    # what crosses into a node per all-reduce, counted at MPI's collectives, at 2, 4 and 8
    # ranks (one device each, 8 MiB): the reduce-scatter's stays under 2 x the message
    # (2 (N-1)/N: 1, 1.5, 1.75), the all-gather's grows as N - 1 (1, 3, 7). The bench checks
    # each exchange's sums first (every float, integers exact in any order), here over 4, 2
    # and 1 pipelined chunks a shard
    for np in 2 4 8; do
        timeout "$T" "${MPIRUN[@]}" -np $np "$mgtrain" bench allreduce --device cpu --gpus 0 \
            --mock threads=1 --min-bytes 8M --max-bytes 8M --json "$tmp/b$np.json" \
            >"$tmp/b$np.txt" 2>&1 || fail "bench at $np ranks: $(tail -5 "$tmp/b$np.txt")"
        python3 -c 'import json,sys; n=int(sys.argv[2]); r=json.load(open(sys.argv[1]))["results"][0]; b=r["bytes"]; ag=r["allgather"]["bytes_in"]/b; rs=r["reduce_scatter"]["bytes_in"]/b; assert abs(ag-(n-1))<1e-9 and abs(rs-2*(n-1)/n)<1e-9, (n, ag, rs); print(f"{n} ranks: in/size allgather {ag:g}, reduce-scatter {rs:g}")' \
            "$tmp/b$np.json" $np || fail "bytes in at $np ranks: $(tail -2 "$tmp/b$np.txt")"
    done
    ;;
bad_env)
    # nodes with different local device counts, and --grad-dtype bf16 across nodes: clear
    # errors, no hang
    timeout "$(secs 60)" "${MPIRUN[@]}" -np 1 "$mgtrain" "${RUN[@]}" --gpus 0,1 --epochs 1 : \
        -np 1 "$mgtrain" "${RUN[@]}" --gpus 0 --epochs 1 >"$tmp/out.txt" 2>&1
    rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "rc $rc: $(tail -5 "$tmp/out.txt")"
    grep -q 'node 1 has 1 devices but node 0 has 2: every node must use the same local device count' \
        "$tmp/out.txt" || fail "no clear error: $(grep mgtrain "$tmp/out.txt")"
    echo "$(grep -m1 'node 1 has' "$tmp/out.txt")"
    # --grad-dtype bf16 is for one node: across processes a one-line refusal, no hang
    timeout "$(secs 60)" "${MPIRUN[@]}" -np 2 "$mgtrain" "${RUN[@]}" --gpus 0 --epochs 1 --grad-dtype bf16 \
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
# a sanitizer's report in any rank's output fails the case, even one that expected a failure
if grep -lE "ERROR: AddressSanitizer|WARNING: ThreadSanitizer|runtime error:" "$tmp"/*.txt 2>/dev/null; then
    fail "a sanitizer reported (the files above)"
fi
