#!/usr/bin/env bash
# The project's test command: install (idempotent), lint, then the whole suite, end-to-end
# tests included (they start real vLLM engines and Ray; 15-23 minutes on 2 cores, README).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
VENV="${ROLLFLEET_VENV:-$ROOT/.venv}"
"$VENV/bin/ruff" check .
# Two pytest-xdist workers: the end-to-end tests one after another on one, the rest beside them
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -n 2 --durations=25 tests "$@"
