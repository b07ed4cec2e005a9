"""A real LiteLLM proxy (`litellm --config FILE --port N`) in a venv of its own, for the routing end-to-end test.

`requirements-litellm-proxy.txt` is `pip install 'litellm[proxy]==1.108.7'` (the pinned release, whose extra
installs from the package index in full) frozen, plus prometheus-client for the callback (its header says why);
`ensure_proxy_env()` installs it with `pip --no-deps` once per machine into
`~/.cache/specwatch/litellm-proxy-<hash of the list>/` (testbed/cache.py; about 800 MB, a minute or two); a stamp
written last marks the install complete, and a changed list installs a new venv beside the old one.

The proxy reads its deployments and `litellm_settings.callbacks` from the config, as in production; it finds a
callback module given as `module.attribute` beside the config file (`get_instance_fn`,
`litellm/proxy/types_utils/utils.py`), and specwatch's own package through PYTHONPATH (this checkout). It refuses
to start without a master key (`enforce_master_key_boot_verdict`, `litellm/proxy/auth/master_key_boot_check.py`),
so every request carries one. Ready is `GET /health/liveliness`: `/health` asks for the key and calls every
deployment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed import cache
from testbed.engine_env import REPO_ROOT
from testbed.server_process import ServerProcess

REQUIREMENTS = Path(__file__).with_name("requirements-litellm-proxy.txt")
DEFAULT_VENV = cache.pinned_venv_dir("litellm-proxy", REQUIREMENTS)
LITELLM_VERSION = "1.108.7"


class ProxyEnvError(RuntimeError):
    """The proxy venv could not be built or the proxy did not start; the message has pip's or the log's tail."""


def ensure_proxy_env(venv: Path = DEFAULT_VENV) -> Path:
    """The proxy venv's `litellm` script, installing or rebuilding the venv first if needed."""
    cache.ensure_pinned_venv(venv, REQUIREMENTS, _install, executable="litellm")
    return venv / "bin" / "litellm"


def _install(venv: Path) -> None:
    python = shutil.which("python3.11") or "python3"
    steps = (
        [python, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
        + ["-r", str(REQUIREMENTS)],
        [str(venv / "bin" / "python"), "-c", "import litellm.proxy.proxy_server, fastapi, uvicorn"],
    )
    for argv in steps:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
        if result.returncode != 0:
            output = "\n".join(
                line for line in (result.stdout + result.stderr).splitlines() if not line.startswith("WARNING: Loc")
            )
            raise ProxyEnvError(f"{' '.join(argv[:4])} failed with exit code {result.returncode}:\n{output[-4000:]}")


@dataclass(frozen=True)
class LitellmProxySpec:
    """What the proxy runs: its config file (callback modules beside it) and the master key it demands."""

    config: Path
    master_key: str


class LitellmProxy(ServerProcess[LitellmProxySpec]):
    """One real LiteLLM proxy on loopback, in its own process group."""

    error = ProxyEnvError
    log_prefix = "litellm"
    start_timeout = 600.0
    health_path = "/health/liveliness"
    exited_note = " while starting"

    def __init__(self, script: Path, spec: LitellmProxySpec, workdir: Path, port: int | None = None) -> None:
        super().__init__(spec, workdir, port)
        self.script = script

    def argv(self) -> list[str]:
        return [str(self.script), "--config", str(self.spec.config), "--host", "127.0.0.1", "--port", str(self.port)]

    def describe(self) -> str:
        return f"LiteLLM proxy on port {self.port}"

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "LITELLM_MASTER_KEY": self.spec.master_key,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the model price list at start-up
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
            "NO_DOCS": "True",
        }
