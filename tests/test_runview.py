"""The Runs view model (app/runview.py): each step's rollout from the recorded meta, never from numbers
that repeat; zero-std groups' dilution with hand-derived numbers; the trainer's and GRPO Lens's
quantities named apart; logged series with gaps, one unit per chart. And the lab's canned comparisons
change one setting each (grpo/lab/comparisons.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from test_runs import CONFIG, step_tensors

import grpo
from app.runview import run_overview
from grpo.lab import COMPARISONS, LabConfig
from grpo.lab.train import train
from grpo.runs import RunWriter, load_run, load_step


def write(root: Path, steps: dict[int, dict[str, Any]], logged: dict[str, dict[str, float]] | None = None) -> Path:
    """One micro-batch per step, the same batch at every step; ``steps`` maps a step to its meta extras."""
    writer = RunWriter(root / "r", "trl", CONFIG)
    for step, extra in steps.items():
        path = writer.write_step(step, 0, step_tensors(0), {})
        batch, config, _ = load_step(path)
        writer.write_step(step, 0, step_tensors(0), {"loss": float(grpo.evaluate(batch, config).loss), **extra})
    writer.update(status="done", **({"logged": logged} if logged else {}))
    return root / "r"


def test_a_run_captured_before_rollouts_were_recorded_says_unknown(tmp_path: Path) -> None:
    """Steps 1 and 2 hold the very same batch: equal numbers, yet nothing says step 2 reused step 1's rollout."""
    steps = run_overview(load_run(write(tmp_path, {1: {}, 2: {}})))["steps"]
    assert steps[0]["lens_loss"] == steps[1]["lens_loss"]
    for s in steps:
        assert s["rollout"]["rollout"] is None and s["rollout"]["text"].startswith("rollout unknown")


def test_the_rollout_and_iteration_come_from_the_recorded_meta(tmp_path: Path) -> None:
    rollouts = {
        1: {"rollout": {"rollout": 1, "iteration": 1, "iterations": 3}},
        2: {"rollout": {"rollout": 1, "iteration": 2, "iterations": 3}},
        3: {"rollout": {"rollout": 1, "iteration": 3, "iterations": 3}},
        4: {"rollout": {"rollout": 2, "iteration": 1, "iterations": 3}},
    }
    texts = [s["rollout"]["text"] for s in run_overview(load_run(write(tmp_path, rollouts)))["steps"]]
    assert texts == [
        "rollout 1, iteration 1 of 3: completions sampled for this step",
        "rollout 1, iteration 2 of 3: the same completions as step 1 after 1 update",
        "rollout 1, iteration 3 of 3: the same completions as step 1 after 2 updates",
        "rollout 2, iteration 1 of 3: completions sampled for this step",
    ]


def test_verl_epochs_without_a_rollout_say_unknown_with_the_epochs(tmp_path: Path) -> None:
    steps = run_overview(load_run(write(tmp_path, {1: {"rollout": {"iterations": 2}}})))["steps"]
    assert steps[0]["rollout"]["rollout"] is None and "ppo_epochs = 2" in steps[0]["rollout"]["text"]


def test_a_lab_run_records_its_rollouts(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "lab", "lab", grpo.LossConfig.from_preset("article"))
    train(LabConfig(steps=3, num_iterations=2, prompts_per_step=2, group_size=2, hidden=8), writer)
    writer.close()
    view = run_overview(load_run(tmp_path / "lab"))
    assert [(s["rollout"]["rollout"], s["rollout"]["iteration"]) for s in view["steps"]] == [(1, 1), (1, 2), (2, 1)]
    # the lab is its own trainer: its steps' logs are drawn as logged, and its grad_norm named apart
    assert all("reward" in s["logged"] and "grad_norm" in s["logged"] for s in view["steps"])
    assert [p["trainer"] for p in view["named_apart"]] == ["grad_norm"]


def test_zero_std_groups_dilution_is_said_with_numbers(tmp_path: Path) -> None:
    """Rows 0-1 (group 0) have rewards 1, 1: zero std. Under seq-mean-token-mean each of the 4 rows weighs
    1/4 of the loss, so group 0 holds 2/4 = 50% of the weight: group 1's gradient is 0.5x what it would
    be with group 0 left out."""
    tensors = step_tensors(0) | {"row_rewards": torch.tensor([1.0, 1.0, 1.0, 0.0])}
    writer = RunWriter(tmp_path / "z", "trl", grpo.LossConfig.from_preset("trl-grpo"))
    writer.write_step(1, 0, tensors, {})
    writer.update(status="done")
    zero = run_overview(load_run(tmp_path / "z"))["steps"][0]["zero_std"]
    assert (zero["groups"], zero["of_groups"], zero["rows"], zero["of_rows"]) == (1, 2, 2, 4)
    assert zero["weight_share"] == pytest.approx(0.5) and zero["factor"] == pytest.approx(0.5)
    assert "1 of 2 groups (2 of 4 rows)" in zero["text"] and "50%" in zero["text"] and "0.5x" in zero["text"]


def test_logged_series_have_gaps_and_each_chart_one_unit(tmp_path: Path) -> None:
    """The trainer logged reward at step 1 only: step 2's value is null (a gap), not step 1's carried on."""
    logged = {"1": {"reward": 0.5, "completions/mean_length": 4.0, "grad_norm": 0.9}}
    view = run_overview(load_run(write(tmp_path, {1: {}, 2: {}}, logged)))
    charts = {c["id"]: c for c in view["charts"]}
    reward = {s["name"]: s["values"] for s in charts["run-reward"]["series"]}
    assert reward["reward (trainer logged)"] == [0.5, None]
    assert charts["run-reward"]["unit"] == "reward" and charts["run-length"]["unit"] == "tokens"
    assert all("length" not in s["name"] for s in charts["run-reward"]["series"])
    # grad_norm (parameters) and lens/grad_norm_logps (token log-probs): two charts, said to differ
    assert [p["lens"] for p in view["named_apart"]] == ["lens/grad_norm_logps"]
    assert "differ" in view["named_apart"][0]["text"]
    assert {"run-grad_norm", "run-lens-grad_norm_logps"} <= set(charts)


def test_each_step_holds_its_micro_batches_losses(tmp_path: Path) -> None:
    view = run_overview(load_run(write(tmp_path, {1: {}})))
    step = view["steps"][0]
    assert [m["micro"] for m in step["micro"]] == [0]
    assert step["micro"][0]["lens_loss"] == step["lens_loss"]  # the label prints what the chart draws


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_a_canned_comparison_changes_one_setting(name: str) -> None:
    comparison = COMPARISONS[name]
    assert len(comparison.changes()) <= 1, comparison.changes()
    for field, values in comparison.changes().items():  # the texts name what changes, with its values
        key = field.removeprefix("config.")
        assert key in comparison.title + comparison.watch or all(str(v) in comparison.title for v in values)


def test_grpo_vs_dr_grpo_names_the_presets_own_values() -> None:
    comparison = COMPARISONS["length-bias"]
    assert comparison.changes() == {"config.aggregation": ["seq-mean-token-mean", "seq-mean-token-sum-norm"]}
    preset = grpo.LossConfig.from_preset("trl-dr_grpo")
    assert f"max_completion_length = {preset.max_completion_length}" in comparison.watch
    assert f"advantage = {preset.advantage}" in comparison.watch


def test_a_step_with_holes_in_its_mask_opens_as_the_same_loss(tmp_path: Path) -> None:
    """The lab's step route and the runs' step view give the dashboard a step whose counted tokens are not a
    prefix (a tool's tokens masked mid-row): each row up to its last counted token with its mask, so /loss
    on it is the step file's own loss. (The lab's route cut each row at its count of counted tokens before,
    dropping the last ones and counting the masked one.)"""
    from app.runview import step_batch
    from app.settings import Settings
    from app.summaries import step_input
    from grpo.requests import batch_from_request

    tensors = step_tensors(0)
    tensors["completion_mask"][0] = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])  # a hole, then padding
    path = RunWriter(tmp_path / "r", "trl", CONFIG).write_step(1, 0, tensors, {})
    batch, config, _ = load_step(path)
    expected = grpo.evaluate(batch, config).loss
    lab = step_input(str(path), 1, Settings())["request"]
    assert lab["completion_mask"][0] == [1.0, 0.0, 1.0, 1.0]
    runs, _, _ = step_batch(load_run(tmp_path / "r"), 1, 0)
    for request in (lab, runs):
        got = grpo.evaluate(batch_from_request(request), config).loss
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)  # float32 file values through JSON floats
