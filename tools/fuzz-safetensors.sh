#!/usr/bin/env bash
# Builds the safetensors fuzz target (libFuzzer + ASan + UBSan) and runs it for a bounded time, seeded with the test corpus.
#
# usage: tools/fuzz-safetensors.sh [SECONDS]      (default 60)
# env:   FUZZ_CC (default clang), FUZZ_DIR (default build-fuzz/safetensors), FUZZ_ARGS (extra
#        libFuzzer flags). New inputs go to $FUZZ_DIR/corpus, crashes to $FUZZ_DIR/artifacts;
#        a crash makes the script exit non-zero. Reproduce one with
#        $FUZZ_DIR/fuzz_safetensors $FUZZ_DIR/artifacts/crash-...
set -euo pipefail

secs=${1:-60}
case $secs in '' | *[!0-9]*) echo "fuzz-safetensors: SECONDS must be a whole number, not '$secs'" >&2; exit 2 ;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
cc=${FUZZ_CC:-clang}
dir=${FUZZ_DIR:-$root/build-fuzz/safetensors}

if ! command -v "$cc" >/dev/null; then
  echo "fuzz-safetensors: $cc not found; on Debian: apt-get install clang libclang-rt-14-dev" >&2
  exit 2
fi
mkdir -p "$dir/corpus" "$dir/artifacts"

# shellcheck disable=SC2054  # the commas belong to -fsanitize=
flags=(-std=c11 -g -O1 -D_GNU_SOURCE -Wall -Wextra -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined)
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' |
     "$cc" "${flags[@]}" -x c - -o "$dir/.probe" 2>/dev/null; then
  echo "fuzz-safetensors: $cc cannot link -fsanitize=fuzzer; on Debian: apt-get install libclang-rt-14-dev" >&2
  exit 2
fi
rm -f "$dir/.probe"

# shellcheck disable=SC2046  # pkg-config output is meant to split into flags
"$cc" "${flags[@]}" -I "$root/include" -I "$root/src" \
  "$root/tools/fuzz/fuzz_safetensors.c" "$root/src/nn/safetensors.c" "$root/src/base/status.c" \
  $(pkg-config --cflags --libs libcjson) -o "$dir/fuzz_safetensors"

# the header's vocabulary, so that mutations reach past the JSON checks sooner
cat >"$dir/safetensors.dict" <<'DICT'
"{"
"}"
"["
"]"
":"
","
"\""
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F64\""
"\"F32\""
"\"F16\""
"\"BF16\""
"\"I64\""
"\"I32\""
"\"I16\""
"\"I8\""
"\"U8\""
"\"BOOL\""
"\\u0000"
"\\ud800"
"4294967296"
"9007199254740993"
"-1"
"1e300"
"0.5"
"\xc0\xaf"
"\xed\xa0\x80"
"\xf4\x90\x80\x80"
DICT

echo "fuzz-safetensors: running $dir/fuzz_safetensors for ${secs}s"
# shellcheck disable=SC2086  # FUZZ_ARGS holds several flags
"$dir/fuzz_safetensors" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
  -use_value_profile=1 -print_final_stats=1 -dict="$dir/safetensors.dict" \
  -artifact_prefix="$dir/artifacts/" ${FUZZ_ARGS:-} \
  "$dir/corpus" "$root/tests/data/safetensors/bad" "$root/tests/data/safetensors/good"
