#!/usr/bin/env bash
# Checks that every C, CUDA and header file is as .clang-format (Debian's clang-format 14) lays it
# out; with --fix rewrites them. Lists the files that differ and exits 1 when there are any.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$fmt" ]; then
  echo "check-format: clang-format not found (Debian: apt-get install clang-format)" >&2
  exit 1
fi
mapfile -t files < <(find src include tests tools -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)
if [ "${1:-}" = "--fix" ]; then
  "$fmt" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  if ! "$fmt" --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: not as .clang-format lays them out (fix: bash tools/check-format.sh --fix):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
