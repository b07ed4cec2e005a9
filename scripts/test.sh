#!/usr/bin/env bash
# The whole test suite from a fresh machine: venv + deps, Prometheus/promtool/Alertmanager, ruff (lint, format) and mypy,
# generated-file check, the real vLLM engine's venv, then pytest. Extra arguments go to pytest (e.g. scripts/test.sh -k tracking).
# With --fast: the venv, then the unit tier only (pytest --fast, see tests/tiers.py) and the seconds it took.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
finish() {  # pytest's exit status, where "no tests collected" (5) is a failure too
  if [ "$1" -eq 5 ]; then
    echo "test: pytest collected no tests" >&2
    exit 1
  fi
  exit "$1"
}
case " $* " in
  *" --fast "*)
    start=$(date +%s%N)
    .venv/bin/python -m pytest -q "$@"
    rc=$?
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    printf 'test: unit tier took %d.%d s\n' $((ms / 1000)) $((ms % 1000 / 100))
    finish $rc ;;
esac
# The LiteLLM routing callback's tests drive a real litellm.Router: its extra, once (a few minutes).
bash scripts/bootstrap.sh litellm || exit 1
if [ -f scripts/ensure_prometheus.sh ]; then
  bash scripts/ensure_prometheus.sh || echo "test: could not install prometheus/alertmanager; their tests will skip" >&2
fi
.venv/bin/ruff check . || { echo "test: ruff check found problems (settings in pyproject.toml)" >&2; exit 1; }
.venv/bin/ruff format --check . || { echo "test: files not in ruff's format: run .venv/bin/ruff format ." >&2; exit 1; }
.venv/bin/mypy || { echo "test: mypy found type errors (settings in pyproject.toml)" >&2; exit 1; }
if .venv/bin/specwatch generate --help >/dev/null 2>&1; then
  .venv/bin/specwatch generate --check || { echo "test: generated alerts/dashboards are stale: run 'specwatch generate'" >&2; exit 1; }
fi
# The real engines of the real_engine tests, each built once per machine into ~/.cache/specwatch (testbed/cache.py):
# vLLM's CPU build (a venv, a few minutes) now, and llama.cpp's llama-server (15-30 minutes on 2 cores) in the
# background at the lowest priority, while the checks and the other tests run; its tests run last
# (tests/conftest.py) and wait for it. Unfinished at exit (its tests deselected), it is stopped: ninja resumes it.
builder=
case " $* " in
  *"not real_engine"*|*"not e2e"*) ;;  # the real-engine tests are deselected: no need for the engines
  *) if ! .venv/bin/python -m testbed.llamacpp_build --check >/dev/null; then
       log=$(.venv/bin/python -m testbed.llamacpp_build --log-path)
       mkdir -p "$(dirname "$log")"
       echo "test: building llama-server in the background (once per machine; progress: tail -f $log)" >&2
       setsid nice -n 19 .venv/bin/python -m testbed.llamacpp_build >"$log" 2>&1 &
       builder=$!  # a process group of its own (setsid), so that cmake and the compilers stop with it
     fi
     .venv/bin/python -m testbed \
       || echo "test: the real vLLM engine could not be installed; its tests will fail and say why" >&2 ;;
esac
stop_builder() { [ -n "$builder" ] && kill -- "-$builder" 2>/dev/null; }
trap stop_builder EXIT
# The 25 slowest tests close every whole-suite log, so each CI run says where its time went.
.venv/bin/python -m pytest -q --durations=25 "$@"
finish $?
