"""Import a benchmark of bench/ (not a package) as a module, for tests that drive its code."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_script(name: str) -> ModuleType:
    """A fresh module from bench/<name>.py (registered in sys.modules under its name if not there yet)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module
