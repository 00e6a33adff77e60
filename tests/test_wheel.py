"""The wheel as a team installs it into its training environment: torch and TRL already there, no web stack.

The wheel is built from this checkout and installed, with pip's own resolver and no index, into a fresh venv
that sees this project's torch and TRL the way a training environment's site-packages would (a .pth line),
so pip can only add what is missing: the report must name grpo-lens alone. The library then runs from the
wheel, in a directory outside the checkout, with every web package made unimportable.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from api_fixtures import ROOT, ragged_body
from test_api_runs import write_run
from test_layering import BLOCK_WEB, WEB

# The server's distributions: allowed in the wheel's metadata only behind the `server` extra.
WEB_DISTRIBUTIONS = {"fastapi", "uvicorn", "httptools", "pydantic", "pydantic-settings", "python-multipart"}
WEB_DISTRIBUTIONS |= {"jinja2", "plotly", "starlette", "httpx"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # built from a copy of what the wheel is made of: a build in the checkout would leave build/ and a fresh
    # grpo_lens.egg-info there (the latter shadows the installed metadata for whoever has the checkout on the path)
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "grpo", source / "grpo", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (path,) = out.glob("grpo_lens-*.whl")
    return path


def requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(name).decode().splitlines()
    return [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]


def test_the_wheel_holds_the_library_and_no_web_dependency_outside_the_server_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        tops = {n.split("/")[0] for n in zf.namelist() if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"grpo"}
    required = requirements(wheel)
    core = [r for r in required if "extra ==" not in r]
    names = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in core}
    assert names == {"torch", "numpy", "safetensors", "orjson", "pysimdjson"}, core
    (torch,) = [r for r in core if r.lower().startswith("torch")]
    assert "==" not in torch and ">=" in torch  # a range: the training environment's torch stays
    server = {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in required if 'extra == "server"' in r}
    assert server >= {"fastapi", "uvicorn", "pydantic", "jinja2", "plotly"}
    assert not names & WEB_DISTRIBUTIONS
    report = [r for r in required if 'extra == "report"' in r]
    assert [re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in report] == ["plotly"]  # the report's alone


@pytest.fixture(scope="module")
def training_env(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv whose site-packages sees this project's torch and TRL, with the wheel installed by pip."""
    venv = tmp_path_factory.mktemp("training-env")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "training_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    report = venv / "report.json"
    install = ["install", "--no-index", "--quiet", "--report", str(report), str(wheel)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *install],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    installed = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installed == ["grpo-lens"]  # torch, TRL and every other dependency were already there and stay
    yield python


VERSIONS = "import importlib.metadata as m, torch; print(torch.__version__, m.version('trl'), m.version('numpy'))"


def test_installing_the_wheel_moves_neither_torch_nor_trl(training_env: Path) -> None:
    ours = subprocess.run([sys.executable, "-c", VERSIONS], capture_output=True, text=True, check=True).stdout
    theirs = subprocess.run([str(training_env), "-c", VERSIONS], capture_output=True, text=True, check=True).stdout
    assert theirs == ours and theirs.startswith("2.13.0")


def test_the_wheel_evaluates_and_checks_a_run_without_the_web_stack(training_env: Path, tmp_path: Path) -> None:
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps(ragged_body(2)))
    good, tampered = write_run(tmp_path, "good"), write_run(tmp_path, "tampered", tamper=True)
    script = BLOCK_WEB + (
        "import grpo, grpo.capture, grpo.check\n"
        "from grpo.__main__ import main\n"
        "print(grpo.__file__, file=sys.stderr)\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )

    def grpo_cli(*args: str) -> subprocess.CompletedProcess[str]:
        # cwd outside the checkout: the grpo imported is the wheel's, not this repository's
        return subprocess.run(
            [str(training_env), "-c", script, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )

    evaluated = grpo_cli("eval", str(batch), "--json")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    (where,) = [line for line in evaluated.stderr.splitlines() if line.endswith("__init__.py")]
    assert where.startswith(str(training_env.parent.parent)), where  # the wheel's copy, in the fresh venv
    answer = json.loads(evaluated.stdout)
    assert len(answer["tokens"]["ratio"]) == len(ragged_body(2)["per_token_logps"])
    assert grpo_cli("check-run", str(good)).returncode == 0
    # the same command fails on a run whose step-2 losses were moved by 0.01: the check ran, it did not just exit
    assert grpo_cli("check-run", str(tampered)).returncode == 1


# The server's packages unimportable, plotly left: an environment with `grpo-lens[report]` and no web app.
BLOCK_SERVER = BLOCK_WEB.replace(repr(WEB), repr(tuple(m for m in WEB if m != "plotly")))
REPORT = (
    "import json\n"
    "from grpo.__main__ import main\n"
    "code = main(sys.argv[1:])\n"
    "web = {'app', 'fastapi', 'starlette', 'uvicorn'}\n"
    "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in web)))\n"
    "import grpo\n"
    "print(grpo.__file__)\n"
    "raise SystemExit(code)\n"
)


def test_the_wheel_writes_a_report_with_the_report_extra_and_without_the_web_stack(
    wheel: Path, training_env: Path, tmp_path: Path
) -> None:
    # the extra resolves offline to the plotly the environment has: nothing to add, nothing moved
    extra = ["install", "--no-index", "--dry-run", "--quiet", "--report", str(tmp_path / "r.json"), f"{wheel}[report]"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(training_env), *extra], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "r.json").read_text())["install"] == []
    run, out = write_run(tmp_path, "tampered", tamper=True), tmp_path / "report.html"

    def report(prelude: str) -> subprocess.CompletedProcess[str]:
        argv = [str(training_env), "-c", prelude + REPORT, "report", str(run), "--html", str(out), "--jobs", "1"]
        return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    written = report(BLOCK_SERVER)
    assert written.returncode == 0, written.stderr[-2000:]
    web, where = written.stdout.splitlines()[-2:]
    assert json.loads(web) == [] and where.startswith(str(training_env.parent.parent)), where  # the wheel's grpo
    page = out.read_text(encoding="utf-8")
    assert 'id="verdict">differ</span>' in page and "Plotly.newPlot" in page and len(page) > 1_000_000
    out.unlink()
    without = report(BLOCK_WEB)  # plotly unimportable too: the command names the extra
    assert without.returncode == 2 and "pip install 'grpo-lens[report]'" in without.stderr and not out.exists()
