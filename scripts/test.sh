#!/usr/bin/env bash
# The test command: set up, then lint (ruff), type-check (mypy) and run the suite (pytest)
# against a real mosquitto, real ONNX Runtime, the real demo models and video.
# Extra arguments go to pytest. The default set leaves out the tests marked `slow` and runs in two
# pytest-xdist workers (addopts in pyproject.toml): `scripts/test.sh -m slow` runs only the slow ones,
# `-m ""` everything, `-n 0` in one process.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# Test-only Debian packages (the demo does not need them): a headless Chromium for the live view's
# browser test (tests/test_liveview.py), installed with no recommends.
if ! command -v chromium-headless-shell >/dev/null && ! command -v chromium >/dev/null; then
  echo "test: installing chromium-headless-shell (the live view's browser test)"
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium-headless-shell >/dev/null
fi

echo "test: ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "test: mypy (--python-version 3.10)"
PYTHON="$PWD/.venv/bin/python" .ci/typecheck
echo "test: pytest"
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "test: pytest collected no tests: the suite is missing, which is an error, not a pass" >&2
  exit 1
fi
exit "$rc"
