"""`python -m testbed` (from the checkout's root): build the engine venv, the tiny models and the LiteLLM proxy's
venv now, with progress, so that the test suite or `specwatch demo --real` finds them ready. Exit 0 also where
the CPU cannot run the engine (it says why); 1 if an install fails.

It lives here, above `engine_env` and `models`, because it needs both and `models` needs `engine_env`.
"""

from __future__ import annotations

import argparse
import sys

from testbed.engine_env import VLLM_VERSION, EngineEnvError, cpu_support, ensure_engine_env
from testbed.litellm_proxy import ProxyEnvError, ensure_proxy_env
from testbed.models import build_tiny_models


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m testbed",
        description="Build the real vLLM engine's venv (about 3.5 GB), the tiny models and the LiteLLM proxy's venv "
        "(about 800 MB) now, once per machine, in ~/.cache/specwatch.",
    ).parse_args(argv)
    supported, reason = cpu_support()
    if not supported:
        print(f"testbed: the real vLLM engine cannot run here ({reason}); its tests will skip", file=sys.stderr)
        return 0
    try:
        env = ensure_engine_env(show_progress=sys.stderr.isatty())
        models = build_tiny_models(env)
        proxy = ensure_proxy_env()
    except (EngineEnvError, ProxyEnvError) as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1
    print(
        f"testbed: vLLM {VLLM_VERSION} ready in {env.venv} ({reason}); models in {models.target.parent}; "
        f"LiteLLM proxy in {proxy.parents[1]}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
