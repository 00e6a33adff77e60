"""grpo.runs: the run directory, atomic writes, self-describing step files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
from grpo.__main__ import main
from grpo.runs import RunWriter, list_runs, load_run, load_step


def step_tensors(seed: int = 0, B: int = 4, T: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) - 0.05
    mask = torch.ones(B, T)
    mask[1, 3:] = 0
    return {
        "per_token_logps": old + 0.1 * torch.randn(B, T, generator=g).clamp(-0.4, 0.04),
        "old_per_token_logps": old,
        "ref_per_token_logps": old - 0.05,
        "completion_mask": mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "row_rewards": torch.tensor([1.0, 0.0, 1.0, 0.0]),
        "row_groups": torch.tensor([0, 0, 1, 1]),
    }


CONFIG = grpo.LossConfig.from_preset("trl-grpo", beta=0.04)


def test_run_json_and_step_files_round_trip(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "r", "trl", CONFIG, versions={"trl": "1.16.0"})
    tensors = step_tensors()
    path = writer.write_step(1, 0, tensors, {"loss": 0.25, "metrics": {"kl": 0.01}})
    writer.write_step(1, 1, step_tensors(1), {"loss": 0.5})
    writer.write_step(2, 0, step_tensors(2), {})
    assert path == tmp_path / "r" / "steps" / "000001-000.safetensors"
    writer.update(status="done")

    run = load_run(tmp_path / "r")
    assert run.info["format"] == 1 and run.info["source"] == "trl" and run.info["status"] == "done"
    assert run.info["versions"]["trl"] == "1.16.0" and run.info["versions"]["torch"] == torch.__version__
    assert run.info["config"] == CONFIG.to_dict()
    assert [(s.step, s.micro) for s in run.steps] == [(1, 0), (1, 1), (2, 0)]
    assert run.step_numbers() == [1, 2]

    batch, config, info = load_step(path)
    assert config == CONFIG
    assert (info["step"], info["micro"], info["rank"]) == (1, 0, None)
    assert info["meta"] == {"loss": 0.25, "metrics": {"kl": 0.01}}
    torch.testing.assert_close(info["tensors"]["row_groups"], tensors["row_groups"])
    # Batch zeroes padding, so compare the counted positions; float32 stays float32 bit for bit
    assert batch.logp.dtype == torch.float32
    assert torch.equal(batch.logp, tensors["per_token_logps"] * tensors["completion_mask"])
    direct = grpo.evaluate(grpo.Batch(**{k: v for k, v in tensors.items() if not k.startswith("row_")}), CONFIG)
    assert grpo.evaluate(batch, config).loss.item() == direct.loss.item()


def test_ranks_name_their_files(tmp_path: Path) -> None:
    RunWriter(tmp_path, "verl", {"preset": "verl-grpo"}, rank=0).write_step(3, 2, step_tensors(), {})
    RunWriter(tmp_path, "verl", {"preset": "verl-grpo"}, rank=1).write_step(3, 2, step_tensors(), {})
    run = load_run(tmp_path)
    assert [p.path.name for p in run.steps] == ["000003-002-rank0.safetensors", "000003-002-rank1.safetensors"]
    assert load_step(run.steps[1].path)[2]["rank"] == 1
    assert load_step(run.steps[0].path)[1] == grpo.LossConfig.from_preset("verl-grpo")


def test_a_crash_mid_write_leaves_no_half_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = RunWriter(tmp_path, "lab", CONFIG)
    first = writer.write_step(1, 0, step_tensors(0), {"loss": 1.0})
    before = first.read_bytes()

    def crash(src: Any, dst: Any) -> None:  # the process dies between writing and renaming
        raise OSError("killed")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="killed"):
        writer.write_step(1, 0, step_tensors(5), {"loss": 2.0})  # overwrite: old file kept whole
    with pytest.raises(OSError, match="killed"):
        writer.write_step(1, 1, step_tensors(6), {"loss": 3.0})  # new file: none at all
    with pytest.raises(OSError, match="killed"):
        writer.update(status="done")
    monkeypatch.undo()
    assert first.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == ["000001-000.safetensors"]  # no temp left
    assert json.loads((tmp_path / "run.json").read_text())["status"] == "running"
    assert [s.micro for s in load_run(tmp_path).steps] == [0]


def test_list_runs_skips_what_is_not_a_run(tmp_path: Path) -> None:
    RunWriter(tmp_path / "a", "lab", CONFIG)
    RunWriter(tmp_path / "b", "upload", CONFIG)
    (tmp_path / "junk").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{nope")
    assert sorted(r.name for r in list_runs(tmp_path)) == ["a", "b"]
    assert list_runs(tmp_path / "missing") == []


def test_bad_source_and_bad_run_are_named(tmp_path: Path) -> None:
    with pytest.raises(grpo.GrpoInputError, match="source"):
        RunWriter(tmp_path, "wandb", CONFIG)
    with pytest.raises(grpo.GrpoInputError, match=r"run\.json"):
        load_run(tmp_path)


def test_eval_uses_the_files_config_and_flags_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = RunWriter(tmp_path, "trl", CONFIG).write_step(1, 0, step_tensors(), {})
    batch, _, _ = load_step(path)

    def cli(*flags: str) -> dict[str, Any]:
        assert main(["eval", str(path), "--json", *flags]) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        return out

    own = cli()
    assert own["config"] == CONFIG.to_dict()
    assert own["loss"] == pytest.approx(float(grpo.evaluate(batch, CONFIG).loss), rel=1e-6)
    assert cli("--set", "beta=0")["config"]["beta"] == 0 and cli("--set", "beta=0")["config"]["preset"] == "trl-grpo"
    replaced = cli("--preset", "verl-dapo")["config"]
    assert replaced == grpo.LossConfig.from_preset("verl-dapo").to_dict()
    assert main(["eval", str(path), "--set", "nope=1"]) == 2
    assert "nope" in capsys.readouterr().err
