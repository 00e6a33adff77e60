"""The image's inputs agree with each other: one torch pin, locks that cover pyproject.toml, a build context
that holds what the Dockerfile copies and nothing else. (`make docker-test` builds and runs the image.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def pins(lock: str) -> dict[str, str]:
    """name -> version of every `name==version \\` entry of a uv lock file."""
    text = (ROOT / lock).read_text()
    return {name.lower(): version for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\$", text, re.M)}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_one_torch_pin_everywhere(project: dict[str, Any]) -> None:
    # The library declares a range (it installs beside a training environment's torch); the app, the image,
    # make and the trainers' constraints pin one version, inside that range.
    (torch,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "torch"]
    (version,) = re.findall(r"^TORCH\s+\?= torch==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert torch.specifier.contains(version) and "==" not in str(torch.specifier)
    assert f"torch=={version}" in (ROOT / "requirements" / "constraints.txt").read_text().split()
    assert re.search(rf"^ARG TORCH_VERSION={re.escape(version)}$", (ROOT / "Dockerfile").read_text(), re.M)
    assert re.search(rf"^TORCH\s+\?= torch=={re.escape(version)}$", (ROOT / "Makefile").read_text(), re.M)
    assert f"torch=={version}+cpu" in (ROOT / "docker" / "torch-cpu.txt").read_text().split()


LOCKS = [("requirements.lock", ("server",)), ("requirements-dev.lock", ("server", "dev"))]


@pytest.mark.parametrize(("lock", "extras"), LOCKS)
def test_lock_covers_pyproject(project: dict[str, Any], lock: str, extras: tuple[str, ...]) -> None:
    locked = {normalise(k): v for k, v in pins(lock).items()}
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for extra in extras for r in project["optional-dependencies"][extra]]
    assert "torch" not in locked  # pinned by version and variant apart (make lock explains why)
    for req in wanted:
        if req.name != "torch":
            assert normalise(req.name) in locked, f"{req.name} is not in {lock}: run make lock LOCK_UPGRADE="
            assert req.specifier.contains(locked[normalise(req.name)]), f"{lock} pins {req.name} outside {req}"


def test_every_lock_entry_is_hashed() -> None:
    for lock in ("requirements.lock", "requirements-dev.lock"):
        entries = re.split(r"\n(?=[A-Za-z0-9_.-]+==)", (ROOT / lock).read_text())[1:]
        assert len(entries) == len(pins(lock))
        assert all("--hash=sha256:" in entry for entry in entries), lock


def test_dev_lock_keeps_the_runtime_pins() -> None:
    runtime, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    assert {name: dev.get(name) for name in runtime} == runtime


def test_build_context_is_what_the_dockerfile_copies() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\S+) \S+$", dockerfile, re.M))
    allowed = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line[:1] == "!"}
    assert copied == allowed
    assert not allowed & {"tests", "docs", "bench", ".venv", "Makefile", "pyproject.toml"}


def test_compose_runs_the_image_safely() -> None:
    service = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["grpo-lens"]
    assert all(port.startswith("127.0.0.1:") for port in service["ports"])  # never every interface
    assert "runs:/data/runs" in service["volumes"] and service["read_only"] and "/tmp" in service["tmpfs"]
    assert service["environment"]["GRPO_LENS_AUTH_TOKEN"].startswith("${GRPO_LENS_AUTH_TOKEN:?")  # required
    assert service["restart"] == "unless-stopped" and service["healthcheck"]["start_period"]
    assert service["cap_drop"] == ["ALL"]
