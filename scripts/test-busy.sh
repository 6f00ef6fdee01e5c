#!/usr/bin/env bash
# The test command on a busy machine, as CI machines and developers' laptops are: one busy-loop process
# per core (each pinned to its core with taskset where there is one), then scripts/test.sh with the same
# arguments. The busy loops are killed however it ends (exit, error, Ctrl-C, SIGTERM once the tests have
# stopped), and each also ends by itself once this script is gone (even killed with SIGKILL).
#
#   bash scripts/test-busy.sh [pytest arguments]    e.g. -p no:cacheprovider --timeout 600, -k delivery
#
# EDGED_BUSY_HOGS=N runs N busy loops instead of one per core (0: none). EDGED_TEST_SLOWDOWN (tests/conftest.py)
# is left as the caller set it: the suite's waits are meant to hold without it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cores=$(nproc)
hogs_wanted=${EDGED_BUSY_HOGS:-$cores}
if ! [[ $hogs_wanted =~ ^[0-9]+$ ]]; then
  echo "test-busy: EDGED_BUSY_HOGS=$hogs_wanted: want a whole number of busy-loop processes" >&2
  exit 2
fi

hogs=()
stop_hogs() {
  if [ "${#hogs[@]}" -gt 0 ]; then
    kill "${hogs[@]}" 2>/dev/null || true
    wait "${hogs[@]}" 2>/dev/null || true
  fi
}
trap stop_hogs EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

loop='while kill -0 "$1" 2>/dev/null; do :; done' # spins a core for as long as this script lives
pin=()
command -v taskset >/dev/null && pin=(taskset -c)
for ((i = 0; i < hogs_wanted; i++)); do
  if [ "${#pin[@]}" -gt 0 ]; then
    "${pin[@]}" "$((i % cores))" sh -c "$loop" busy-loop "$$" &
  else
    sh -c "$loop" busy-loop "$$" &
  fi
  hogs+=("$!")
done
where=$([ "${#pin[@]}" -gt 0 ] && echo "pinned one per core" || echo "unpinned: no taskset")
echo "test-busy: $hogs_wanted busy-loop process(es) on $cores core(s), $where"

start=$(date +%s)
set +e
bash scripts/test.sh "$@"
rc=$?
set -e
echo "test-busy: scripts/test.sh exit $rc after $(($(date +%s) - start)) s beside $hogs_wanted busy loop(s)"
exit "$rc"
