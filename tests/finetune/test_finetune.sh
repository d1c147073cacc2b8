#!/usr/bin/env bash
# Fine-tuning, evaluation and prediction as torchvision's users do them, and what the console
# says (tests/CMakeLists.txt registers each case as finetune.<case>; each runs resnet20 on
# data/sample, 2 mock devices, a few seconds):
#   pth        a torch.save file (zip and legacy) to --pretrained: one line naming it as
#              PyTorch's and the converter; scripts/pth_to_safetensors.py converts
#              torchvision's own 1000-class mobilenet_v2 (and a references checkpoint.pth),
#              which then fine-tunes to 10 classes and 1 channel, each change said in a line
#              (skips without torch in /usr/bin/python3)
#   defaults   -e --resume takes the checkpoint's architecture, size, channels, mean/std and
#              interpolation (the training's last validation to the digit); -a that
#              contradicts it exits 2 before building anything; an override is said
#   predict    predict --json on the validation folder: one record per image whose top-1
#              agrees with -e's Acc@1; a bad image is said and exits 1; text output
#   confusion  a model that always answers one class: -e's confusion matrix and per-class
#              lines are exactly that (rows true, columns predicted, class names)
#   overwrite  a fresh run into another run's checkpoints exits 2, --overwrite and --resume
#              auto go on
#   keep_last  --keep-last 2 over 3 epochs keeps model_1 and model_2
#   console    the checkpoint lines, the closing summary, a resumed epoch's notice, a second
#              Ctrl-C's line
#   fixres     training at 24 px validated at 32 (--val-crop-size): each validation runs the
#              trained weights (its numbers are -e's from the checkpoint, to the digit)
#   cli        the references' aliases, a bare --amp, -b's note, --lr-warmup-epochs alone,
#              help and --version
# usage: test_finetune.sh CASE MGTRAIN DATA_SAMPLE SCRATCH
set -euo pipefail
case_="$1" mgtrain="$2" sample="$3" scratch="$4/finetune.$1"
here="$(cd "$(dirname "$0")/../.." && pwd)"
rm -rf "$scratch" && mkdir -p "$scratch" && cd "$scratch"
fail() { echo "FAIL: $*" >&2; exit 1; }
has() { grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "no '$2' in $1"; }; }
QUICK=(--gpus 0,1 --device cpu --mock threads=1 -j 2 -b 32)

# run NAME WANT_RC args...: mgtrain's stdout+stderr in NAME.out, its exit status checked
run() {
  local name="$1" want="$2"; shift 2
  set +e
  "$mgtrain" "$@" > "$name.out" 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq "$want" ] || { cat "$name.out" >&2; fail "$name: exit $rc, expected $want"; }
}

# the first validation line's Acc@1 of a run's output
acc1() { grep -m1 '^ \* Acc@1' "$1" | awk '{print $3}'; }

case "$case_" in
pth)
  if ! /usr/bin/python3 -c 'import torch, torchvision' 2> /dev/null; then
    echo "finetune.pth: skipped: /usr/bin/python3 has no torch/torchvision"; exit 77
  fi
  /usr/bin/python3 - <<'PY'
import argparse, torch, torchvision
torch.manual_seed(0)
sd = torchvision.models.mobilenet_v2().state_dict()   # torchvision's own init, 1000 classes
torch.save(sd, "mv2.pth")
torch.save(sd, "mv2_legacy.pth", _use_new_zipfile_serialization=False)
torch.save({"model": {"module." + k: v for k, v in sd.items()}, "epoch": 3,
            "args": argparse.Namespace(model="mobilenet_v2")}, "checkpoint.pth")
PY
  for f in mv2.pth mv2_legacy.pth; do
    run "refused_$f" 1 "$sample" -a mobilenet_v2 --pretrained "$f" "${QUICK[@]}" --image-size 32
    has "refused_$f.out" "--pretrained $f: a PyTorch torch.save file"
    has "refused_$f.out" "scripts/pth_to_safetensors.py $f OUT.safetensors"
    [ "$(grep -c mgtrain: "refused_$f.out")" -le 2 ] || fail "more than one line for $f"
  done
  /usr/bin/python3 "$here/scripts/pth_to_safetensors.py" mv2.pth mv2.safetensors > conv.out
  /usr/bin/python3 "$here/scripts/pth_to_safetensors.py" mv2_legacy.pth mv2l.safetensors >> conv.out
  cmp <(tail -c +9 mv2.safetensors | head -c 100) <(tail -c +9 mv2l.safetensors | head -c 100)
  set +e
  /usr/bin/python3 "$here/scripts/pth_to_safetensors.py" checkpoint.pth ref.safetensors 2> untrusted.err
  rc=$?
  set -e
  [ $rc -ne 0 ] && grep -q -- "--trust" untrusted.err || fail "a references checkpoint with args loaded without --trust"
  /usr/bin/python3 "$here/scripts/pth_to_safetensors.py" checkpoint.pth ref.safetensors --trust > ref.out
  has ref.out "from its 'model' entry"
  # torchvision's 1000-class, 3-channel weights into 10 grey classes
  for w in mv2.safetensors ref.safetensors; do
    run "tune_$w" 0 "$sample" -a mobilenet_v2 --pretrained "$w" "${QUICK[@]}" --image-size 32 \
      --epochs 1 --max-steps 2
    has "tune_$w.out" "=> new head: classifier.1 re-initialised as torchvision initialises it, for 10 classes (the file's is for 1000)"
    has "tune_$w.out" "=> input channels: the stem adapted from the file's 3 channels to 1 (summed"
  done
  # -e evaluates the file's model as it is: a head of 1000 classes is no model of 10
  run eval_foreign 1 "$sample" -a mobilenet_v2 --pretrained mv2.safetensors -e "${QUICK[@]}" --image-size 32
  has eval_foreign.out "classifier.1.weight: shape [1000, 1280] in the file, [10, 1280] expected"
  ;;
defaults)
  run train 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 1 --image-size 32 --mean 0.3 \
    --std 0.35 --interpolation bicubic --checkpoint-dir ck
  run eval 0 "$sample" -e --resume ck/checkpoint.safetensors "${QUICK[@]}"
  has eval.out "=> architecture resnet20, from ck/checkpoint.safetensors"
  has eval.out "=> from ck/checkpoint.safetensors: input 32 px, 1 channel, its mean and std, validation resize 32, bicubic"
  has eval.out "1x32x32; resize 32 (bicubic), centre crop 32; mean 0.3 std 0.35"
  [ "$(acc1 eval.out)" = "$(acc1 train.out)" ] || fail "-e gives $(acc1 eval.out), training validated $(acc1 train.out)"
  for word in "lr " "epochs " "warning"; do
    ! grep -q "^=> $word" eval.out || { cat eval.out >&2; fail "-e printed a training line ($word)"; }
  done
  grep -q '^Test: \[.*ETA' eval.out || fail "-e shows no progress with an ETA"
  has eval.out "=> top-1 per class, the 5 lowest:"
  # a contradicting -a: exit 2, before any device allocation (no devices line)
  run wrong_arch 2 "$sample" -e -a resnet32 --resume ck/checkpoint.safetensors "${QUICK[@]}"
  has wrong_arch.out "a checkpoint of resnet20; -a resnet32 asks for another architecture"
  ! grep -q "=> devices" wrong_arch.out || fail "the mismatch was found after the devices were set up"
  run override 0 "$sample" -e --pretrained ck/model_best.safetensors --image-size 28 "${QUICK[@]}"
  has override.out "=> --image-size 28 overrides the checkpoint's input size 32"
  ;;
predict)
  run train 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 2 --checkpoint-dir ck
  run eval 0 "$sample" -e --resume ck/model_best.safetensors "${QUICK[@]}"
  "$mgtrain" predict --checkpoint ck/model_best.safetensors "$sample/val" --json -k 3 \
    --gpus 0,1 --device cpu -b 16 > pred.jsonl 2> pred.err
  [ "$(wc -l < pred.jsonl)" -eq 300 ] || fail "predict: $(wc -l < pred.jsonl) records for 300 images"
  /usr/bin/python3 - "$(acc1 eval.out)" <<'PY'
import json, os, sys
hits = n = 0
for line in open("pred.jsonl"):
    r = json.loads(line)
    assert len(r["top"]) == 3 and abs(sum(t["probability"] for t in r["top"])) <= 1.0001, r
    assert r["top"][0]["probability"] >= r["top"][1]["probability"] >= r["top"][2]["probability"]
    truth = os.path.basename(os.path.dirname(r["path"]))
    hits += r["top"][0]["class"] == truth
    n += 1
acc = 100.0 * hits / n
want = float(sys.argv[1])
assert abs(acc - want) < 5e-4, f"predict's top-1 {acc:.3f} against -e's {want:.3f}"
print(f"predict: top-1 {acc:.3f} over {n} images, as -e")
PY
  first=$(ls "$sample/val/Bag" | head -1)
  echo "not an image" > bad.png
  run bad 1 predict --checkpoint ck/model_best.safetensors bad.png "$sample/val/Bag/$first" \
    --gpus 0 --device cpu
  has bad.out "bad.png: unreadable or not an image"
  grep -q "^$sample/val/Bag/$first: [A-Za-z_-]* [0-9.]*%, " bad.out || { cat bad.out >&2; fail "no text prediction for the good image"; }
  has bad.out "1 of 2 images could not be read"
  run missing 1 predict --checkpoint ck/model_best.safetensors nowhere/ --device cpu
  has missing.out "nowhere/: No such file or directory"
  run usage 2 predict "$sample/val" --device cpu
  has usage.out "give --checkpoint FILE"
  ;;
confusion)
  run train 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 1 --max-steps 1 --checkpoint-dir ck
  # the same model with fc answering class 2 whatever the image: weight 0, bias one-hot
  /usr/bin/python3 - <<'PY'
import json, struct
b = open("ck/model_best.safetensors", "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
data = bytearray(b[8 + n:])
for name in ("fc.weight", "fc.bias"):
    lo, hi = h[name]["data_offsets"]
    vals = [0.0] * ((hi - lo) // 4)
    if name == "fc.bias":
        vals[2] = 5.0
    data[lo:hi] = struct.pack("<%df" % len(vals), *vals)
open("const.safetensors", "wb").write(b[:8 + n] + bytes(data))
PY
  run eval 0 "$sample" -e --pretrained const.safetensors --confusion cm.csv --per-class "${QUICK[@]}"
  has eval.out "=> confusion matrix (rows true, columns predicted) in cm.csv"
  has eval.out " * Acc@1 10.000"
  /usr/bin/python3 - <<'PY'
import csv
rows = list(csv.reader(open("cm.csv")))
names = rows[0][1:]
assert rows[0][0] == "true \\ predicted", rows[0]
assert len(names) == 10 and names[2] == "Coat", names
for i, r in enumerate(rows[1:]):
    assert r[0] == names[i], r
    counts = [int(v) for v in r[1:]]
    assert counts == [0, 0, 30] + [0] * 7, (r[0], counts)
print("confusion: every image predicted Coat, 30 per class, as the model answers")
PY
  has eval.out "   Coat                     100.000%  (30 images)"
  has eval.out "   Bag                        0.000%  (30 images)"
  ;;
overwrite)
  run first 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 1 --max-steps 2 --checkpoint-dir ck
  before=$(md5sum ck/model_best.safetensors)
  run again 2 "$sample" -a resnet20 "${QUICK[@]}" --epochs 1 --max-steps 2 --checkpoint-dir ck
  has again.out "--checkpoint-dir ck holds another run's checkpoints (checkpoint.safetensors): --resume auto continues that run, --overwrite starts afresh over them"
  [ "$before" = "$(md5sum ck/model_best.safetensors)" ] || fail "a refused run touched model_best"
  run over 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 1 --max-steps 2 --checkpoint-dir ck --overwrite
  run resumed 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 2 --max-steps 2 --checkpoint-dir ck --resume auto
  has resumed.out "=> resumed from ck/checkpoint.safetensors at epoch 1 step 0"
  ;;
keep_last)
  run keep 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 3 --max-steps 2 --checkpoint-dir ck --keep-last 2
  [ ! -e ck/model_0.safetensors ] && [ -s ck/model_1.safetensors ] && [ -s ck/model_2.safetensors ] ||
    { ls ck >&2; fail "--keep-last 2 did not keep exactly model_1 and model_2"; }
  has keep.out ", and ck/model_2.safetensors"
  /usr/bin/python3 - <<'PY'
import json, struct
b = open("ck/model_1.safetensors", "rb").read()
m = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]
assert m["epoch"] == "2" and m["arch"] == "resnet20" and json.loads(m["class_names"])[0] == "Ankle_boot", m
PY
  ;;
console)
  run train 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 2 --max-steps 3 --checkpoint-dir ck
  grep -q "^=> saved ck/checkpoint.safetensors (epoch 0, Acc@1 [0-9.]*)" train.out || { cat train.out >&2; fail "no checkpoint line"; }
  grep -q "^=> done: 2 epochs in [0-9:]* (6 steps, [0-9.]* training images/s); best Acc@1 [0-9.]* at epoch [01] (ck/model_best.safetensors)" train.out ||
    { cat train.out >&2; fail "no closing summary"; }
  grep -q "^=> device memory at its peak: mock:0 [0-9.]* MiB, mock:1 [0-9.]* MiB" train.out || fail "no peak memory"
  # a stop mid-epoch (the time limit), then the resumed epoch says what its averages cover
  run stopped 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 1 --checkpoint-dir ck2 --time-limit 0.3 -p 1
  has stopped.out "=> stopped at epoch 0 step"
  run resumed 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 1 --checkpoint-dir ck2 --resume auto -p 1
  grep -q "^=> epoch 0 resumes at step [1-9][0-9]* of 10: its averages (in parentheses) and training loss cover steps" resumed.out ||
    { cat resumed.out >&2; fail "no notice for the resumed epoch"; }
  # two Ctrl-C: the second quits at once, saying so. Device 0 hangs in its first update, so
  # the first cannot end the run before the second comes (two signals sent back to back may
  # be delivered as one, and a run that stops first restores SIGINT's default)
  set +e
  "$mgtrain" "$sample" -a resnet20 --gpus 0,1 --device cpu --mock 'threads=1;fault=hang@0:1:sgd_update' \
    -j 2 -b 32 --epochs 50 -p 1 --timeout 60 > twice.out 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q '^=> epochs ' twice.out && break; sleep 0.05; done
  sleep 0.3
  kill -INT $pid
  sleep 0.3
  kill -INT $pid
  wait $pid
  rc=$?
  set -e
  [ $rc -eq 130 ] || { cat twice.out >&2; fail "two Ctrl-C: exit $rc, expected 130"; }
  has twice.out "mgtrain: a second interrupt: quitting now, without saving"
  ;;
fixres)
  # the twin planned at 32 px validates the weights trained at 24: were they not copied in,
  # the training's validation would be the initial model's and -e's (the checkpoint's) another
  run train 0 "$sample" -a resnet20 "${QUICK[@]}" --epochs 2 --lr 0.02 --image-size 24 \
    --val-crop-size 32 --checkpoint-dir ck
  has train.out "=> validation at 32x32 (FixRes: a twin of each replica planned for it)"
  run eval 0 "$sample" -e --resume ck/checkpoint.safetensors "${QUICK[@]}"
  has eval.out "input 24 px, 1 channel, its mean and std, validation resize 32, validation crop 32"
  has eval.out "1x32x32; resize 32 (bilinear), centre crop 32"
  want=$(grep '^ \* Acc@1' train.out | tail -1)
  [ "$(grep '^ \* Acc@1' eval.out)" = "$want" ] ||
    fail "-e: $(grep '^ \* Acc@1' eval.out); the training's last validation: $want"
  ;;
cli)
  run aliases 0 --model resnet20 --data-path "$sample" --output-dir ck "${QUICK[@]}" --epochs 1 --max-steps 2
  [ -s ck/checkpoint.safetensors ] || fail "--output-dir wrote no checkpoint"
  has aliases.out "=> -b 32 is the total batch over all 2 devices here (16 each); torchvision's references (--"
  run test_only 0 --model resnet20 --data-path "$sample" --test-only --resume ck/checkpoint.safetensors "${QUICK[@]}"
  has test_only.out "=> evaluating ck/checkpoint.safetensors: resnet20"
  run amp 0 "$sample" -a resnet20 --amp "${QUICK[@]}" --epochs 1 --max-steps 2 --overwrite
  has amp.out "=> --amp: bf16 on these mock devices"
  has amp.out "=> mixed precision bf16"
  run amp_value 0 "$sample" -a resnet20 --amp fp16 "${QUICK[@]}" --epochs 1 --max-steps 2
  has amp_value.out "=> mixed precision fp16"
  run amp_bad 2 "$sample" -a resnet20 --amp=int8 "${QUICK[@]}"
  has amp_bad.out "see mgtrain train --help"
  run warmup 0 "$sample" -a resnet20 --lr-warmup-epochs 1 "${QUICK[@]}" --epochs 2 --max-steps 2
  has warmup.out "steplr schedule"
  has warmup.out "1 warm-up epochs (constant)"
  run help 0 train --help
  has help.out "architectures (86; \`mgtrain model\` for sizes"
  has help.out "each family's defaults"
  has help.out "  cifar_resnet   images' own size"
  has help.out "  efficientnet   224 to 600 px"
  has help.out "  inception      299 px            rrc (RandomResizedCrop)   resize 342, centre crop 299"
  run model_unknown 2 model -a resnet19
  has model_unknown.out "unknown architecture; the 86 known:"
  has model_unknown.out "convnext_large"
  has model_unknown.out "maxvit_t"
  # the 86 names but alexnet and googlenet, and the family cifar_resnet
  [ "$(tail -n +2 model_unknown.out | tr ' ' '\n' | grep -c '_\|[0-9]$')" -ge 85 ] || fail "the list is cut"
  run bench_unknown 2 bench -a resnet19 --device cpu
  has bench_unknown.out "\`mgtrain model\` lists them"
  # a flag without its value, or unknown: one line naming the subcommand's help
  run bench_amp 2 bench -a resnet20 --amp
  has bench_amp.out "mgtrain bench: --amp needs a value (mgtrain bench --help)"
  run bogus 2 "$sample" --bogus
  has bogus.out "mgtrain train: unknown option '--bogus' (mgtrain train --help)"
  run version 0 --version
  grep -q "^mgtrain [0-9]*\.[0-9]*\.[0-9]*" version.out || fail "--version: $(cat version.out)"
  ;;
*) fail "unknown case $case_" ;;
esac
echo "finetune.$case_: passed"
