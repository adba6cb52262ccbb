"""The declared dependencies match the imports: every third-party package the library imports is
a dependency (or behind an extra), every dependency is used, and test-only packages sit in the
``test`` extra."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import partialfc

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(partialfc.__file__).resolve().parent

# import name -> distribution name
DISTRIBUTION = {
    "PIL": "pillow",
    "cv2": "opencv-python-headless",
    "faiss": "faiss-cpu",
    "filelock": "filelock",
    "matplotlib": "matplotlib",
    "numpy": "numpy",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "safetensors": "safetensors",
    "scipy": "scipy",
    "torch": "torch",
    "tqdm": "tqdm",
    "yaml": "pyyaml",
}
# imported only by optional features: import name -> distribution of an extra
OPTIONAL = {"mlflow": "mlflow-skinny"}
# needed at run time without an import of their own
INDIRECT = {"onnxscript": "torch.onnx.export(dynamo=True) runs on it"}


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def _library_imports() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"partialfc"}


def test_every_imported_package_is_a_dependency_and_every_dependency_is_used():
    declared = _names(_project()["dependencies"])
    imported = _library_imports()
    optional = imported & set(OPTIONAL)
    imported -= optional
    unknown = imported - set(DISTRIBUTION)
    assert not unknown, f"imports without a known distribution: {sorted(unknown)}"
    extras = set().union(*map(_names, _project()["optional-dependencies"].values()))
    not_in_extra = {OPTIONAL[name] for name in optional} - extras
    assert not not_in_extra, f"optional imports in no extra: {sorted(not_in_extra)}"
    missing = {DISTRIBUTION[name] for name in imported} - declared
    assert not missing, f"imported but not declared: {sorted(missing)}"
    unused = declared - {DISTRIBUTION[name] for name in imported} - set(INDIRECT)
    assert not unused, f"declared but never imported: {sorted(unused)}"


def test_test_only_packages_are_in_the_test_extra():
    project = _project()
    assert "scikit-learn" not in _names(project["dependencies"])
    assert "scikit-learn" in _names(project["optional-dependencies"]["test"])


def test_torch_floor_has_the_onnx_exporter_the_code_calls():
    requirement = next(r for r in _project()["dependencies"] if r.startswith("torch"))
    floor = tuple(int(p) for p in requirement.split(">=")[1].split(".")[:2])
    assert floor >= (2, 5)  # torch.onnx.export(dynamo=True, dynamic_shapes=...) appeared in 2.5
