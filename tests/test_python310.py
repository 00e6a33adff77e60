"""The library declares Python >= 3.10 (pyproject.toml; mypy checks it as 3.10): these machines have no torch for
3.10 (the CPU wheel on disk is for 3.11 and the registries only hold CUDA builds of several GB), so Python 3.10
itself checks what it can without torch: every module of ``grpo`` compiles under it, and every name it imports
from the standard library exists in 3.10's (``tomllib``, ``typing.Self``, ``datetime.UTC``, ``enum.StrEnum`` came
in 3.11). Skipped where no Python 3.10 runs (on PATH or under pyenv)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK = r"""
import ast, importlib, pathlib, sys
THIRD_PARTY = {"torch", "numpy", "safetensors", "orjson", "simdjson", "grpo", "trl", "verl", "transformers",
               "datasets", "ray", "tensordict", "accelerate", "omegaconf", "tokenizers", "peft", "yaml"}
missing = []
for path in sorted(pathlib.Path("grpo").rglob("*.py")):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in found:
            if module.split(".")[0] in THIRD_PARTY or module == "__future__":
                continue
            try:
                imported = importlib.import_module(module)
            except ImportError:
                missing.append(f"{path}:{node.lineno}: {module}")
                continue
            if name is not None and not hasattr(imported, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{path}:{node.lineno}: {module}.{name}")
print("\n".join(missing))
sys.exit(1 if missing else 0)
"""


def python310() -> str | None:
    """A Python 3.10 interpreter: on PATH, else one pyenv installed (these machines have 3.10.13 there)."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates = [shutil.which("python3.10"), *map(str, sorted(pyenv.glob("versions/3.10*/bin/python3.10")))]
    for found in filter(None, candidates):
        ok = subprocess.run([found, "-c", "import sys; assert sys.version_info[:2] == (3, 10)"], capture_output=True)
        if ok.returncode == 0:
            return found
    return None


@pytest.fixture(scope="module")
def py310() -> str:
    found = python310()
    if found is None:
        pytest.skip("no python3.10 on this machine")
    return found


def test_every_module_compiles_under_python_310(py310: str) -> None:
    done = subprocess.run(
        [
            py310,
            "-c",
            "import compileall, sys; sys.exit(not compileall.compile_dir('grpo', quiet=1, legacy=False, "
            "force=True, optimize=0, workers=1, ddir='grpo', stripdir=None) )",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": "/tmp/grpo-py310-cache", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_standard_library_names_it_imports_exist_in_310(py310: str) -> None:
    done = subprocess.run([py310, "-c", CHECK], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
