"""Import timm for comparisons without torchvision, which does not import beside the CPU torch here.

timm is a test-only tool (installed with `pip install --no-deps timm`, never a dependency of the course). It
imports torchvision at module level for data transforms we never use; when torchvision is missing, a stand-in
module answers those imports with inert placeholders. Model code (VisionTransformer) doesn't touch them.
"""

import enum
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types


class _Placeholder(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "InterpolationMode":
            return enum.Enum("InterpolationMode", "NEAREST BILINEAR BICUBIC BOX HAMMING LANCZOS NEAREST_EXACT")
        return type(name, (), {"__init__": lambda self, *args, **kwargs: None})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Placeholder(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_timm():
    """Return the timm module, or None when it isn't installed."""
    if importlib.util.find_spec("timm") is None:
        return None
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
    import timm

    return timm
