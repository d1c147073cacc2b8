#!/usr/bin/env bash
# The test command's dependencies (issue 32): `scripts/setup.sh --test` installs PyTorch and
# torchvision for the interop tests, and under the test command (MGT_TEST_REQUIRE_DEPS=1, set
# by scripts/test.sh) a test that would skip for want of what the setup installs fails
# instead; outside it the skip stays a skip. Usage: strict_skips.sh TEST_MODELS SOURCE_DIR.
# Cost: under a second (the missing Python makes test_models' 14 cases end at once).
set -uo pipefail
test_models=$1 src=$2
fail() { echo "FAIL: $*"; exit 1; }

pkgs=$(bash "$src/scripts/setup.sh" --test --list) || fail "setup.sh --test --list: exit $?"
for p in python3-torch python3-torchvision; do
  grep -qx "$p" <<<"$pkgs" || fail "setup.sh --test does not install $p"
done
grep -qx python3-torch <<<"$(bash "$src/scripts/setup.sh" --list)" &&
  fail "setup.sh without --test installs python3-torch (the main job need not have it)"

# a Python without torch: a skip outside the test command, a failure under it (the sanitizer
# build's MGT_TORCH_LOAD_PYTHON=0, which runs mgtrain's side only, is left out)
out=$(env -u MGT_TEST_REQUIRE_DEPS -u MGT_TORCH_LOAD_PYTHON MGT_TEST_PYTHON=/nonexistent/python3 "$test_models" torch_load 2>&1)
rc=$?
[ $rc = 0 ] || fail "outside the test command: exit $rc, expected skips: $(tail -3 <<<"$out")"
grep -q "skipped: PyTorch (python3-torch) is not available" <<<"$out" || fail "no skip said: $(tail -3 <<<"$out")"
out=$(env -u MGT_TORCH_LOAD_PYTHON MGT_TEST_REQUIRE_DEPS=1 MGT_TEST_PYTHON=/nonexistent/python3 "$test_models" torch_load 2>&1)
rc=$?
[ $rc != 0 ] || fail "under MGT_TEST_REQUIRE_DEPS=1 the missing PyTorch passed as skipped"
grep -q "scripts/setup.sh --test installs it" <<<"$out" || fail "no reason given: $(tail -3 <<<"$out")"

# the multi-node tests: mpirun missing is the same
out=$(env PATH=/nonexistent MGT_TEST_REQUIRE_DEPS=1 /bin/bash "$src/tests/mpi/test_mpi.sh" equivalence x x /tmp ON 2>&1)
rc=$?
[ $rc = 1 ] || fail "test_mpi.sh without mpirun under MGT_TEST_REQUIRE_DEPS=1: exit $rc ($out)"
out=$(env -u MGT_TEST_REQUIRE_DEPS PATH=/nonexistent /bin/bash "$src/tests/mpi/test_mpi.sh" equivalence x x /tmp ON 2>&1)
rc=$?
[ $rc = 77 ] || fail "test_mpi.sh without mpirun outside the test command: exit $rc ($out)"
echo "setup.sh --test lists python3-torch and python3-torchvision; skips fail under MGT_TEST_REQUIRE_DEPS=1"
