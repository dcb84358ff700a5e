#!/usr/bin/env bash
# Fresh machine to a passing test suite: make or reuse .venv, install seqtrain[test], check style with ruff
# (lint and format, configured in pyproject.toml), run pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k dictionary; scripts/test.sh -m "not slow" for the fast loop).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup_env.sh" test
# shellcheck disable=SC1091
. "${SEQTRAIN_VENV:-$root/.venv}/bin/activate"
cd "$root"
echo "[test] ruff check, ruff format --check"
ruff check --quiet .
ruff format --check --quiet .
python -m pytest -q -ra "$@"
