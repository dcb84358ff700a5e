#!/usr/bin/env bash
# Make or reuse the project venv (.venv, or $SEQTRAIN_VENV) and install seqtrain into it.
# torch==2.13.0 is installed first only when torch is missing: that pin is the CPU wheel this machine
# keeps on disk; an unpinned torch would pull a multi-GB CUDA build. Usage: scripts/setup_env.sh [extras]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SEQTRAIN_VENV:-$root/.venv}"
extras="${1:-}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating venv at $venv"
  "$py" -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
if ! python -c "import torch" >/dev/null 2>&1; then
  echo "[setup] installing torch==2.13.0"
  python -m pip install -q "torch==2.13.0"
fi
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
stamp="$venv/.seqtrain-installed-$extras"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  echo "[setup] installing seqtrain${extras:+[$extras]}"
  python -m pip install -q -e "$spec"
  touch "$stamp"
fi
# the compiled CPU decoding step, built once into torch's extension cache (a no-op when built; where no C++
# compiler or ninja exists it says so and CPU generation takes the eager step)
python -m seqtrain.generation.cpu_step | sed 's/^/[setup] /'
