#!/usr/bin/env bash
# Fresh machine to a passing test suite: make or reuse .venv, install seqtrain[test], run pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k dictionary).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup_env.sh" test
# shellcheck disable=SC1091
. "${SEQTRAIN_VENV:-$root/.venv}/bin/activate"
cd "$root"
python -m pytest -q -ra "$@"
