#!/usr/bin/env bash
# Create .venv with specwatch, its offline tools' extras and its test dependencies, from nothing. Idempotent and quiet when done already.
# Arguments name more extras to install (scripts/test.sh adds `litellm`, whose routing callback the tests drive).
# `--node`: specwatch and what the daemon needs, nothing else (no pytest, ruff, mypy, plot or mixin extras): for
# a venv on an inference node (scripts/install.sh installs the service the same way, from a wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  echo "bootstrap: $PY not found; install Python >= 3.10" >&2; exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv || { echo "bootstrap: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
fi
extras=test,plot,mixin
for extra in "$@"; do
  case "$extra" in
    --node) extras=node ;;
    *) extras="$extras,$extra" ;;
  esac
done
stamp=".venv/.specwatch-installed-${extras//,/-}"
if [ "$extras" = node ]; then target=.; else target=".[$extras]"; fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e "$target" 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import specwatch, prometheus_client, apscheduler, pynvml, yaml' \
    || { echo "bootstrap: dependency install failed" >&2; exit 1; }
  touch "$stamp"
fi
