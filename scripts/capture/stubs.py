"""Stand-ins that let SGLang's metrics module import outside a server, on CPU.

- `torchvision`: PyPI's torchvision wheels are CUDA builds that fail to load against the CPU torch 2.13.0
  build; SGLang imports it only at module level of multimodal image processors, which the metrics code
  never calls. A placeholder package satisfies those imports; touching any of it at run time would be a bug.
- SGLang 0.5.23's collectors read settings through `sglang.srt.runtime_context.get_*()`, which raise
  "config namespace ... not published" outside a running server; `publish_runtime_context()` installs
  plain namespaces with the few fields the collectors read.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Placeholder:
    """Any attribute, call or subscript of it is another placeholder."""

    def __getattr__(self, name: str) -> "_Placeholder":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __call__(self, *args, **kwargs) -> "_Placeholder":
        return _Placeholder()

    def __getitem__(self, key) -> "_Placeholder":
        return _Placeholder()


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _TorchvisionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


def install_torchvision_placeholder() -> None:
    # transformers must first record torchvision as absent, or it takes the image paths that need it.
    from transformers.utils import import_utils

    assert not import_utils.is_torchvision_available()
    sys.meta_path.insert(0, _TorchvisionFinder())
