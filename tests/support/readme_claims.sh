#!/usr/bin/env bash
# Claims of the documentation (README.md, docs/*.md) that the program can check: a flag listed
# under "Not done yet" is one `mgtrain train --help` does not offer (issue 32: "Not done yet:
# --sync-bn" stood above the section documenting it), and --freeze-bn promises the step of one
# device up to rounding, not its bits ("exactly what one device computes": 1, 2 and 4 devices
# were 4.7e-4 apart after 30 steps). Usage: readme_claims.sh MGTRAIN SOURCE_DIR. Milliseconds.
set -u
mgtrain=$1 src=$2
fail() { echo "FAIL: $*"; exit 1; }
help=$("$mgtrain" train --help) || fail "mgtrain train --help: exit $?"
docs=("$src/README.md")
[ -d "$src/docs" ] && docs+=("$src"/docs/*.md)
while IFS= read -r line; do
  for flag in $(grep -o -- '--[a-z][a-z0-9-]*' <<<"$line"); do
    if grep -q -- "$flag\b" <<<"$help"; then
      fail "the documentation says \"$line\", yet mgtrain train --help offers $flag"
    fi
  done
done < <(grep -hi 'not done yet' "${docs[@]}")
flat=$(cat "${docs[@]}" | tr '\n' ' ' | tr -s ' ')
if grep -qi 'exactly what one device computes' <<<"$flat"; then
  fail "the documentation promises that --freeze-bn computes exactly what one device does"
fi
echo "no flag of mgtrain is listed as not done; --freeze-bn's promise is the step"
