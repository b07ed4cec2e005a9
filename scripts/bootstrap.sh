#!/usr/bin/env bash
# Create .venv with specwatch, its offline tools' extras and its test dependencies, from nothing. Idempotent and quiet when done already.
# Arguments name more extras to install (scripts/test.sh adds `litellm`, whose routing callback the tests drive).
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
for extra in "$@"; do extras="$extras,$extra"; done
stamp=".venv/.specwatch-installed-${extras//,/-}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]" 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import specwatch, prometheus_client, apscheduler, pynvml, yaml' \
    || { echo "bootstrap: dependency install failed" >&2; exit 1; }
  touch "$stamp"
fi
