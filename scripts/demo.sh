#!/usr/bin/env bash
# Try specwatch with nothing but Python: simulated vLLM + SGLang engines, the daemon, a live status table.
# Extra arguments go to `specwatch demo` (e.g. scripts/demo.sh --duration 120). `--real` runs a real vLLM (CPU
# build) from this checkout's testbed/ instead; it builds the engine venv (about 3.5 GB) once per machine into ~/.cache/specwatch.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/specwatch demo "$@"
