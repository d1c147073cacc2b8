#!/usr/bin/env bash
# Seeing a run (tests/CMakeLists.txt registers each case as report.<case>):
#   tensorboard  a short run with --tensorboard, --log and --checkpoint-dir on data/sample (2
#                mock devices, 2 epochs of 4 steps, EMA on: about 3 s): its event file decodes
#                through Debian's python3-protobuf (scripts/check_tensorboard.py) with every
#                scalar of the log, the log opens with the configuration, curves.svg is there
#  plot          `mgtrain plot` on two logs: one SVG with both; bad input refused in one line
# usage: test_report.sh CASE MGTRAIN DATA_SAMPLE SCRATCH
set -euo pipefail
case_="$1" mgtrain="$2" sample="$3" scratch="$4/report.$1"
here="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$scratch" && mkdir -p "$scratch" && cd "$scratch"
fail() { echo "FAIL: $*" >&2; exit 1; }

train() { # LOG TB CKPT [flags...]
  local log="$1" tb="$2" ck="$3"; shift 3
  "$mgtrain" "$sample" -a resnet20 --gpus 0,1 --device cpu -b 32 --epochs 2 --max-steps 4 -p 2 \
    --log "$log" --checkpoint-dir "$ck" ${tb:+--tensorboard "$tb"} "$@" > "$log.out" 2>&1 ||
    { cat "$log.out" >&2; fail "training exited $?"; }
}

svg_ok() { # FILE SERIES_MIN: well-formed XML with three panels and at least that many lines
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
lines = root.findall(f".//{ns}polyline")
titles = [t.text for t in root.iter(f"{ns}text")]
for want in ("loss", "top-1 (%)", "learning rate"):
    if want not in titles:
        sys.exit(f"{sys.argv[1]}: no panel '{want}'")
if len(lines) < int(sys.argv[2]):
    sys.exit(f"{sys.argv[1]}: {len(lines)} lines, expected at least {sys.argv[2]}")
PY
}

case "$case_" in
tensorboard)
  train run.jsonl tb ck --model-ema --model-ema-steps 1
  /usr/bin/python3 "$here/scripts/check_tensorboard.py" tb run.jsonl
  head -1 run.jsonl | grep -q '"type":"config"' || fail "the log's first record is not the configuration"
  head -1 run.jsonl | grep -q '"command_line":"mgtrain ' || fail "no command line in the first record"
  grep '"type":"epoch"' run.jsonl | grep -q '"lr":' || fail "no lr on the epoch records"
  [ -s ck/curves.svg ] || fail "no curves.svg beside the checkpoints"
  svg_ok ck/curves.svg 7
  # a folder that cannot be made is refused before training, in one line naming it
  set +e
  "$mgtrain" "$sample" -a resnet20 --epochs 1 --tensorboard /proc/none/tb > bad.out 2>&1
  rc=$?
  set -e
  [ $rc -eq 1 ] || fail "--tensorboard /proc/none/tb: exit $rc, expected 1"
  grep -q -- '--tensorboard /proc/none/tb' bad.out || { cat bad.out >&2; fail "the message does not name --tensorboard"; }
  ;;
plot)
  train a.jsonl "" cka
  train b.jsonl "" ckb --lr 0.05
  "$mgtrain" plot a.jsonl b.jsonl -o both.svg > /dev/null
  svg_ok both.svg 10
  grep -q '>a train<' both.svg && grep -q '>b val<' both.svg || fail "the legend does not name both logs"
  "$mgtrain" plot a.jsonl --label first -o one.svg > /dev/null
  grep -q '>train<' one.svg || fail "one log: the legend names the kinds"
  echo 'not json' > bad.jsonl
  set +e
  "$mgtrain" plot bad.jsonl -o x.svg 2> bad.err; rc1=$?
  "$mgtrain" plot missing.jsonl -o x.svg 2> missing.err; rc2=$?
  "$mgtrain" plot 2> none.err; rc3=$?
  set -e
  [ $rc1 -eq 1 ] && grep -q 'bad.jsonl: line 1 is not a JSON record' bad.err || { cat bad.err >&2; fail "a bad log"; }
  [ $rc2 -eq 1 ] && grep -q 'missing.jsonl: No such file' missing.err || { cat missing.err >&2; fail "a missing log"; }
  [ $rc3 -eq 2 ] || fail "no log: exit $rc3, expected 2"
  [ ! -e x.svg ] || fail "a refused plot left x.svg"
  ;;
*) fail "unknown case $case_" ;;
esac
echo "report.$case_: passed"
