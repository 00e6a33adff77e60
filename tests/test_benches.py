"""The benchmarks measure what they say: bench/core.py pairs every registered objective with the trainer's own
loss on the same batch (the two losses agree, or it exits 1), and bench/capture.py's quick run records the
steps it says it does. Their ``--quick`` runs are smoke tests of the code paths only: the figures come from
full-size runs (docs/benchmarks.md)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_core_covers_every_registered_loss() -> None:
    """Every TRL 1.16 loss_type GRPO Lens maps and every verl 0.9.1 registered policy loss has a family (verl's
    bypass_mode is timed in the off-policy part, as the rollout correction it is)."""
    pytest.importorskip("verl")
    from verl.trainer.ppo import core_algos

    from grpo.trainer_config import TRL_LOSS_TYPES

    core = bench("core")
    trl = {settings["loss_type"] for _, settings, _ in core.TRL_FAMILIES}
    assert trl == set(TRL_LOSS_TYPES)
    verl = {mode for _, mode, _, _, _ in core.VERL_FAMILIES}
    assert verl == set(core_algos.POLICY_LOSS_REGISTRY) - {"bypass_mode"}


@pytest.fixture(scope="module")
def quick() -> Iterator[dict[str, subprocess.Popen[str]]]:
    """bench/core.py's and bench/capture.py's ``--quick`` runs, started together (each is seconds of imports
    and small batches, on one core): the process of each script."""
    pytest.importorskip("trl")
    started = {
        script: subprocess.Popen(
            [sys.executable, f"bench/{script}.py", "--quick"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script in ("core", "capture")
    }
    try:
        yield started
    finally:
        for proc in started.values():
            proc.kill()
            proc.communicate()


def run(quick: dict[str, subprocess.Popen[str]], script: str) -> str:
    stdout, stderr = quick[script].communicate(timeout=600)
    assert quick[script].returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def test_core_quick_pairs_agree(quick: dict[str, subprocess.Popen[str]]) -> None:
    """Each family's line: the breakdown and the trainer's loss agree to float32 round-off (else exit 1)."""
    out = run(quick, "core")
    lines = [line for line in out.splitlines() if line.startswith(("trl ", "verl "))]
    core = bench("core")
    assert len(lines) == len(core.TRL_FAMILIES) + len(core.VERL_FAMILIES) + 2  # + the two off-policy subjects
    for line in lines:
        diff = float(line.split()[-1])
        assert diff != diff or diff <= core.AGREEMENT, line  # nan: the TRL correction against verl's, no pair
    assert "MISMATCH" not in out


def test_capture_quick_records_the_even_steps(quick: dict[str, subprocess.Popen[str]]) -> None:
    out = run(quick, "capture")
    assert "step files: 2," in out  # steps 2 and 4 of 5
    assert "every step : median wall" in out and "every=10" in out
