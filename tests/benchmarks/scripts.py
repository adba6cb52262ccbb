"""Import a script of ``benchmarks/`` (not a package) as a module for the length of a test."""

import contextlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def benchmark_script(name: str):
    """``benchmarks/<name>.py`` as module ``name``; removed again (with the modules it
    imported from ``benchmarks/``) on exit."""
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        for added in set(sys.modules) - before:
            if (
                getattr(sys.modules[added], "__file__", "")
                and Path(sys.modules[added].__file__).parent == ROOT / "benchmarks"
            ):
                del sys.modules[added]
        sys.modules.pop(name, None)
