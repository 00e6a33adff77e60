"""check-run over many files: a process pool (``--jobs``) gives the serial check's result, file by file.

The numbers are compared to float32 round-off, not bit for bit: a worker runs torch with its share of the
cores' threads, and a reduction split over another number of threads may round differently in the last bits.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from api_fixtures import ROOT
from test_api_runs import write_run

from grpo.check import RunCheck, check_pool, check_run
from grpo.runs import load_run


def same_check(a: RunCheck, b: RunCheck) -> None:
    assert a.ok == b.ok
    assert [(m.step, m.micro, m.rank, m.file, m.trainer_loss, m.num_tokens, m.ok) for m in a.micro] == [
        (m.step, m.micro, m.rank, m.file, m.trainer_loss, m.num_tokens, m.ok) for m in b.micro
    ]
    for x, y in zip(a.micro, b.micro, strict=True):
        assert x.lens_loss == pytest.approx(y.lens_loss, rel=1e-6, abs=1e-7)
        assert set(x.metrics) == set(y.metrics)
    for x, y in zip(a.steps, b.steps, strict=True):
        assert (x.step, x.micro_batches, x.ok, set(x.lens_mean)) == (y.step, y.micro_batches, y.ok, set(y.lens_mean))
        assert x.lens_loss == pytest.approx(y.lens_loss, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("tamper", [False, True])
def test_a_process_pool_checks_as_the_serial_check_does(tmp_path: Path, tamper: bool) -> None:
    run = load_run(write_run(tmp_path, "r", tamper=tamper))
    with check_pool(jobs=2) as pool:
        assert pool is not None
        parallel = check_run(run, pool=pool)
    same_check(parallel, check_run(run))
    assert parallel.ok is not tamper


def test_a_pool_cannot_hand_back_breakdowns(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, "r"))
    with check_pool(jobs=2) as pool, pytest.raises(ValueError, match="seen"):
        check_run(run, seen=lambda *a: None, pool=pool)


def test_the_cli_takes_jobs(tmp_path: Path) -> None:
    good, tampered = write_run(tmp_path, "good"), write_run(tmp_path, "bad", tamper=True)

    def cli(*args: str) -> int:
        return subprocess.run(
            [sys.executable, "-m", "grpo", "check-run", *args], cwd=ROOT, capture_output=True
        ).returncode

    assert cli(str(good), "--jobs", "2") == 0
    assert cli(str(tampered), "--jobs", "2") == 1
    assert cli(str(good), "--jobs", "0") == 2  # argparse: a bad value is a usage error
