"""Long runs open in the Runs view: run.json does not grow with a run's steps.

A 34,000-step NeMo RL import wrote a run.json over 1 MiB (``imported.files`` named every dump file), which the
Runs view refuses (app/summaries.py ``MAX_INFO_BYTES``: listed invalid, 422). run.json now keeps at most
``LISTED_NAMES`` names per list (each step file's meta names its own dump file), and what the trainer logged
lives in ``logged.jsonl``. A 40,000-step import, measured once by hand, is in docs/runs.md; here a few hundred
steps and the size of run.json against the number of steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

import grpo
from app.main import create_app
from app.settings import Settings
from grpo.importers import common
from grpo.importers.nemo_rl import import_nemo_rl
from grpo.runs import RunWriter, Sampling

# one sample of 3 tokens (position 0 is never scored): a step file of 1 row x 2 tokens
LINE = {
    "prev_logprobs": [[0.0, -0.5, -0.7]],
    "generation_logprobs": [[0.0, -0.5, -0.7]],
    "token_loss_mask": [[0, 1, 1]],
    "advantages": [[0.5, 0.5, 0.5]],
    "rewards": [1.0],
    "sample_loss_mask": [1.0],
    "idx": 0,
}


def nemo_import(root: Path, name: str, steps: int) -> Path:
    src = root / f"{name}-dumps"
    src.mkdir()
    for step in range(1, steps + 1):
        (src / f"train_data_step{step}.jsonl").write_text(json.dumps(LINE) + "\n")
    return import_nemo_rl(src, root / "runs" / name)


def test_an_imports_run_json_does_not_grow_with_its_steps(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    short, long = nemo_import(tmp_path, "short", 120), nemo_import(tmp_path, "long", 360)
    sizes = [(run / "run.json").stat().st_size for run in (short, long)]
    # the same description but for the count's digits (on the base commit: +33 bytes a step, 1.1 MB at 34,000)
    assert sizes[1] - sizes[0] <= 8 and sizes[1] < 16_384
    imported = json.loads((long / "run.json").read_text())["imported"]
    assert imported["files_count"] == 360 and imported["files"][-1] == f"train_data_step{common.LISTED_NAMES}.jsonl"
    with TestClient(create_app(Settings(runs_dir=str(tmp_path / "runs"), process_workers=0))) as http:
        listed = {r["name"]: r for r in http.get("/api/v1/runs").json()}
        assert listed["long"]["valid"] and listed["long"]["steps"] == 360
        page = http.get("/api/v1/runs/long")
        assert page.status_code == 200 and len(page.json()["steps"]) == 360


@pytest.mark.parametrize("names", [0, 1, common.LISTED_NAMES])
def test_short_lists_stay_whole(names: int) -> None:
    info = {"imported": {"skipped": [f"{i}.pt" for i in range(names)], "read_as": "x"}, "other": [1] * 500}
    assert common.listed(info) == info


def test_long_lists_are_cut_and_counted() -> None:
    names = [f"{i}.pt" for i in range(common.LISTED_NAMES + 1)]
    info = {"imported": {"skipped": names, "read_as": "x"}}
    cut = common.listed(info)["imported"]
    assert cut == {"skipped": names[:-1], "skipped_count": len(names), "read_as": "x"}
    assert info["imported"]["skipped"] == names  # the importer's own list is left as it is


@pytest.mark.parametrize("sampling", [Sampling(), Sampling.of(every=2, max_bytes=10**9)])
def test_a_captures_run_json_does_not_grow_with_its_steps(tmp_path: Path, sampling: Sampling) -> None:
    """What a capture writes per step (step files, logged lines) lives outside run.json."""
    logps = torch.tensor([[-0.5, -0.7]])  # 1 row x 2 tokens
    tensors = {"per_token_logps": logps, "old_per_token_logps": logps.clone(), "completion_mask": torch.ones(1, 2)}
    tensors["advantages"] = torch.tensor([0.5])
    sizes = []
    for steps in (4, 400):
        writer = RunWriter(tmp_path / str(steps), "trl", grpo.LossConfig(), rank=0, sampling=sampling, resume=True)
        for step in range(1, steps + 1):
            writer.write_step(step, 0, tensors, {"loss": 0.5, "metrics": {"kl": 0.0}})
            writer.log(step, {"loss": 0.5, "kl": 0.0})
        writer.close()
        writer.update(status="done")
        sizes.append((tmp_path / str(steps) / "run.json").stat().st_size)
    assert sizes[1] - sizes[0] <= 8  # the counts' digits
