"""grpo.runs.RunWriter as several processes use it: one run.json writer, file modes, a capture choosing nothing.

- run.json is written by rank 0 (or the one writer) only: a later rank that starts first never makes it, so
  rank 0 never mistakes a fresh run for a resumed one (4 of 11 two-process TRL runs listed two attempts).
- Run files get the modes the process's umask gives (0644 / 0755 under 022), not mkstemp's 0600 or mkdtemp's
  0700: a server running as another user reads them.
- Sampling that chooses no rank (or step) of the run warns at the start and says so in run.json.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import re
import stat
import threading
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_runs import step_tensors

import grpo
from grpo.capture.trl_hooks import trl as capture_trl
from grpo.capture.verl_hooks import verl_writer
from grpo.importers import common
from grpo.runs import RunWriter, Sampling, create_atomic, load_run

CONFIG = grpo.LossConfig.from_preset("trl-grpo", beta=0.04)
TENSORS = step_tensors()


def info(run_dir: Path) -> dict[str, Any]:
    return dict(json.loads((run_dir / "run.json").read_text()))


# --- one run.json writer ---------------------------------------------------------------------------------------
def test_rank1_before_rank0_leaves_a_fresh_run_fresh(tmp_path: Path) -> None:
    """The verdict's race, made deterministic: rank 1 starts (resume=True, as grpo.capture.trl passes it) and
    says its status before rank 0 starts. Rank 0 then finds no run.json: a fresh run, one attempt."""
    rank1 = RunWriter(tmp_path, "trl", CONFIG, rank=1, sampling=Sampling(), resume=True)
    rank1.update(unsupported={}, loss_type="grpo")
    assert not (tmp_path / "run.json").exists()  # rank 1 never creates it
    rank0 = RunWriter(tmp_path, "trl", CONFIG, rank=0, sampling=Sampling(), resume=True)
    assert rank0.attempt == 1 and "attempts" not in info(tmp_path)
    rank1.write_step(1, 0, TENSORS, {})
    rank0.write_step(1, 0, TENSORS, {})
    rank0.update(status="done")
    rank1.update(status="failed")  # its own info only: run.json is rank 0's
    assert info(tmp_path)["status"] == "done" and "attempts" not in info(tmp_path)
    assert [(s.step, s.rank) for s in load_run(tmp_path).steps] == [(1, 0), (1, 1)]


def test_a_real_restart_counts_one_attempt_and_sets_every_rank_aside(tmp_path: Path) -> None:
    for _ in range(2):  # the job, then the job restarted: rank 1 first each time
        rank1 = RunWriter(tmp_path, "trl", CONFIG, rank=1, resume=True)
        rank0 = RunWriter(tmp_path, "trl", CONFIG, rank=0, resume=True)
        for writer in (rank1, rank0):
            writer.write_step(1, 0, TENSORS, {})
            writer.close()
    attempts = info(tmp_path)["attempts"]
    assert len(attempts) == len(set(attempts)) == 2 and attempts[0] == info(tmp_path)["created"]
    aside = tmp_path / "steps" / "superseded" / "1"  # the first attempt's files, both ranks', in one place
    assert sorted(p.name for p in aside.iterdir()) == ["000001-000-rank0.safetensors", "000001-000-rank1.safetensors"]


def test_create_atomic_makes_the_file_once(tmp_path: Path) -> None:
    path, made = tmp_path / "run.json", []
    start = threading.Barrier(8)

    def create(i: int) -> None:
        start.wait()
        made.append((create_atomic(path, f"{i}\n".encode()), i))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    winners = [i for ok, i in made if ok]
    assert len(made) == 8 and len(winners) == 1 and path.read_text() == f"{winners[0]}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no staged file left


def _start_writer(run_dir: str, rank: int | None, start: Any, out: Any) -> None:
    """One process of a run starting: its writer (as grpo.capture.trl makes it), a step file, its status."""
    start.wait(30)
    writer = RunWriter(run_dir, "trl", CONFIG, rank=rank, sampling=Sampling(), resume=True)
    writer.write_step(1, 0, TENSORS, {})
    writer.update(status="done")
    out.put((rank, writer.attempt))


def race(run_dir: Path, ranks: list[int | None]) -> list[tuple[int | None, int]]:
    """Processes starting together into ``run_dir`` (fork: tiny tensors and files only); what each counted."""
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(len(ranks)), ctx.Queue()
    procs = [ctx.Process(target=_start_writer, args=(str(run_dir), r, start, out)) for r in ranks]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    return sorted((out.get(timeout=5) for _ in procs), key=str)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: the processes share the tensors made here")
def test_two_real_processes_racing(tmp_path: Path) -> None:
    for i in range(6):  # ranks 0 and 1 of a fresh run: one attempt, whoever starts first
        race(tmp_path / f"ranks{i}", [0, 1])
        assert "attempts" not in info(tmp_path / f"ranks{i}")
    for i in range(6):  # two writers of one run (two jobs into one directory): one made it, one resumed it
        counted = race(tmp_path / f"two{i}", [None, None])
        assert sorted(a for _, a in counted) == [1, 2]
        attempts = info(tmp_path / f"two{i}").get("attempts", [])  # the last status written wins
        assert len(attempts) == len(set(attempts))


# --- file modes ------------------------------------------------------------------------------------------------
@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    mask = int(request.param)
    saved = os.umask(mask)
    try:
        yield mask
    finally:
        os.umask(saved)


def modes(root: Path) -> dict[str, int]:
    """Each file's and directory's permission bits under ``root``, by path (the root included)."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def assert_umask_modes(root: Path, mask: int) -> None:
    want = {name: (0o777 if (root / name).is_dir() else 0o666) & ~mask for name in modes(root)}
    assert modes(root) == want


def test_written_runs_have_the_umask_modes(tmp_path: Path, umask: int) -> None:
    run_dir = tmp_path / "captured"
    for _ in range(2):  # a resumed run too: run.json created, rewritten; a superseded step file set aside
        writer = RunWriter(run_dir, "trl", CONFIG, rank=0, background=True, resume=True)
        writer.write_step(1, 0, TENSORS, {})
        writer.log(1, {"loss": 0.5})
        writer.close()
        writer.update(status="done")
    RunWriter(run_dir, "trl", CONFIG, rank=1).log(1, {"loss": 0.5})
    assert (run_dir / "steps" / "superseded" / "1").is_dir()
    assert_umask_modes(run_dir, umask)


def test_imported_runs_have_the_umask_modes(tmp_path: Path, umask: int) -> None:
    steps = [common.ImportedStep(s, None, dict(TENSORS), {"imported_from": f"{s}.jsonl"}) for s in (1, 2)]
    common.write_run(tmp_path / "imported", "nemo-rl", CONFIG, steps, {"imported": {"files": ["1.jsonl"]}})
    assert_umask_modes(tmp_path / "imported", umask)


def test_uploaded_runs_have_the_umask_modes(tmp_path: Path, umask: int) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    source = tmp_path / "source"
    RunWriter(source, "trl", CONFIG).write_step(1, 0, TENSORS, {})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.write(source / "run.json", "run.json")
        archive.write(source / "steps" / "000001-000.safetensors", "steps/000001-000.safetensors")
    root = tmp_path / "runs"
    with TestClient(create_app(Settings(runs_dir=str(root), process_workers=0))) as http:
        sent = http.post("/api/v1/runs", files={"file": ("r.zip", buffer.getvalue())}, data={"name": "up"})
        assert sent.status_code == 201, sent.text
    assert_umask_modes(root / "up", umask)


# --- a capture that chooses nothing --------------------------------------------------------------------------
def fake_trl_trainer(processes: int, index: int) -> Any:
    """What grpo.capture.trl reads of a GRPOTrainer before training: its args, processes and hooked methods."""
    hooked = ("_get_per_token_logps_and_entropies", "_compute_loss", "_calculate_rewards", "log")
    methods = {name: lambda *a, **k: None for name in (*hooked, "_generate_and_score_completions")}
    accelerator = SimpleNamespace(num_processes=processes, process_index=index)
    return SimpleNamespace(args={"loss_type": "grpo"}, accelerator=accelerator, loss_type="grpo", **methods)


@pytest.mark.parametrize(
    ("processes", "ranks", "said"),
    [(1, [1], "ranks [1] but the run has ranks 0..0"), (2, [2, 3], "ranks [2, 3] but the run has ranks 0..1")],
)
def test_trl_capture_of_no_rank_warns_and_says_so(tmp_path: Path, processes: int, ranks: list[int], said: str) -> None:
    with (
        pytest.warns(UserWarning, match=re.escape(f"grpo.capture.trl: {said}")),
        capture_trl(fake_trl_trainer(processes, 0), tmp_path, ranks=ranks),
    ):
        pass
    assert info(tmp_path)["capture"]["chooses_nothing"] == said and info(tmp_path)["status"] == "done"


def test_trl_capture_of_no_step_warns(tmp_path: Path) -> None:
    with (
        pytest.warns(UserWarning, match=r"steps \[\] but the run has steps 1"),
        capture_trl(fake_trl_trainer(1, 0), tmp_path, steps=[]),
    ):
        pass
    assert info(tmp_path)["capture"]["chooses_nothing"] == "steps [] but the run has steps 1"


def test_trl_capture_choosing_rank1_only_is_described_by_rank0(tmp_path: Path) -> None:
    """Rank 0 is not captured, rank 1 is: rank 0 still writes run.json (and nothing is said to choose nothing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: rank 1 is a rank of the run
        with capture_trl(fake_trl_trainer(2, 1), tmp_path, ranks=[1]):
            pass
        assert not (tmp_path / "run.json").exists()
        with capture_trl(fake_trl_trainer(2, 0), tmp_path, ranks=[1]):
            pass
    capture = info(tmp_path)["capture"]
    assert capture["ranks"] == [1] and "chooses_nothing" not in capture and info(tmp_path)["status"] == "done"


def test_verl_writer_of_no_rank_warns_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.warns(UserWarning, match=r"grpo.capture.verl: ranks \[4\] but the run has ranks 0..1"):
        writer = verl_writer(tmp_path, 0, Sampling.of(ranks=[4]))
    writer.close()
    assert info(tmp_path)["capture"]["chooses_nothing"] == "ranks [4] but the run has ranks 0..1"


def test_a_real_one_process_trl_run_with_ranks_1(tmp_path: Path) -> None:
    """The finding as reported: ``ranks=[1]`` on one process, a real TRL 1.16 run (one step, ~10 s)."""
    pytest.importorskip("trl")
    from test_capture_scale import captured

    with pytest.warns(UserWarning, match=r"ranks \[1\] but the run has ranks 0..0"):
        run = load_run(captured(tmp_path, "none", steps=1, ranks=[1]))
    assert run.steps == () and run.info["capture"]["chooses_nothing"] == "ranks [1] but the run has ranks 0..0"
    assert run.info["capture"]["skipped_calls"] == 2 and run.info["status"] == "done"
