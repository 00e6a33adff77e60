"""The anomalies of ``grpo.runs.timeline`` on synthetic runs with something planted at a known step: found there,
with the planted tokens, and each sentence's numbers recomputed here from the step files (never on a clean run).

Every run has one micro-batch per step on one process, so a step's loss is its file's loss: the test evaluates
the files itself (``grpo.evaluate``) and derives each anomaly's numbers from those losses and tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
from grpo.marks import number
from grpo.runs import AnomalyThresholds, RunWriter, load_run, load_step, timeline

ROWS, WIDTH = 8, 16
Tensors = dict[str, torch.Tensor]


def steady(seed: int, noise: float = 0.01) -> Tensors:
    """A quiet step: full rows, ratios within 1 ± 3 noise (never clipped), small random advantages."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(ROWS, WIDTH, generator=g) * 2 - 2.0
    return {
        "per_token_logps": (old + noise * torch.randn(ROWS, WIDTH, generator=g)).clamp(max=-1e-3),
        "old_per_token_logps": old,
        "completion_mask": torch.ones(ROWS, WIDTH, dtype=torch.bool),
        "advantages": 0.3 * torch.randn(ROWS, generator=g),
    }


def write_run(run_dir: Path, steps: int, change: Callable[[int, Tensors], None] | None = None, **config: Any) -> None:
    """``steps`` steps of ``steady`` tensors (``change`` edits step s's in place); each file records the loss GRPO
    Lens computes for it as the trainer's (a faithful trainer), so every verdict is match."""
    cfg = grpo.LossConfig.from_preset("trl-grpo", **config)
    writer = RunWriter(run_dir, "trl", cfg)
    for step in range(1, steps + 1):
        t = steady(step)
        if change is not None:
            change(step, t)
        path = writer.write_step(step, 0, t, {})
        assert path is not None
        writer.write_step(step, 0, t, {"loss": file_loss(path), "processes": 1})
    writer.close()


def breakdown(path: Path) -> grpo.Breakdown:
    batch, config, _ = load_step(path)
    return grpo.evaluate(batch, config)


def file_loss(path: Path) -> float:
    return float(breakdown(path).loss)


def step_files(run_dir: Path) -> dict[int, Path]:
    return {ref.step: ref.path for ref in load_run(run_dir).steps}


def of_kind(answer: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [a for a in answer["anomalies"] if a["kind"] == kind]


def top_tokens(values: torch.Tensor, mask: torch.Tensor, n: int) -> list[list[int]]:
    """The ``n`` counted positions with the largest |value|, by a plain loop over every position."""
    cells = [(abs(float(values[r, c])), r, c) for r in range(values.shape[0]) for c in range(values.shape[1])]
    cells = [cell for cell in cells if mask[cell[1], cell[2]]]
    return [[r, c] for _, r, c in sorted(cells, key=lambda x: -x[0])[:n]]


# --- a clean run -------------------------------------------------------------------------------------------------
def test_a_clean_run_has_no_anomaly(tmp_path: Path) -> None:
    write_run(tmp_path / "r", 30)
    answer = timeline(tmp_path / "r")
    assert answer["verdict"] == "match" and len(answer["steps"]) == 30
    assert answer["anomalies"] == []


# --- a loss spike ------------------------------------------------------------------------------------------------
@pytest.mark.numerical
def test_a_planted_loss_spike_is_found_at_its_step_with_its_tokens(tmp_path: Path) -> None:
    """Step 25: row 5 keeps 3 tokens and gets advantage -50, so its 3 tokens carry the loss (seq-mean-token-mean:
    each adds 50 · ratio / (8 rows · 3 tokens) ≈ 2.1). The sentence's z, mean and std are recomputed from the files'
    losses over the 20 steps before (population std), the share from the step's per-token losses."""

    def plant(step: int, t: Tensors) -> None:
        if step == 25:
            t["completion_mask"][5, 3:] = False
            t["advantages"][5] = -50.0

    write_run(tmp_path / "r", 30, plant)
    answer = timeline(tmp_path / "r")
    (spike,) = of_kind(answer, "loss_spike")
    assert spike["step"] == 25 and sorted(spike["tokens"]) == [[5, 0], [5, 1], [5, 2]] and spike["rows"] == [5]
    assert spike["micro"] == 0 and spike["rank"] is None

    files = step_files(tmp_path / "r")
    losses = {s: file_loss(p) for s, p in files.items()}
    before = [losses[s] for s in range(5, 25)]
    mean = math.fsum(before) / len(before)  # the population std, both summed exactly (math.fsum)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in before) / len(before))
    z = (losses[25] - mean) / std
    bd = breakdown(files[25])
    per_token = bd.tokens.loss.double().abs()
    share = float(per_token[5, :3].sum() / per_token.sum())
    torch.testing.assert_close(spike["value"], losses[25], rtol=0, atol=0)
    torch.testing.assert_close(spike["baseline"], mean, rtol=1e-12, atol=1e-12)
    assert spike["sentence"] == (
        f"Step 25's loss {number(losses[25])} is {number(z, 2)} standard deviations above the mean of the 20 steps "
        f"before it ({number(mean)} ± {number(std)}); 3 tokens of row 5 (micro-batch 0) carry "
        f"{number(100 * share, 3)}% of its sum of |per-token loss|."
    )
    assert [a["step"] for a in answer["anomalies"]] == [25, 25]  # the spike, and the few tokens carrying it
    assert {a["kind"] for a in answer["anomalies"]} == {"loss_spike", "few_tokens"}
    assert {a["series"] for a in answer["anomalies"]} == {"loss"}  # both marked on the loss's chart


# --- a few-token step -----------------------------------------------------------------------------------------
@pytest.mark.numerical
def test_a_planted_few_token_step_names_its_tokens_and_their_share(tmp_path: Path) -> None:
    """Step 12: every advantage 0 but row 2's (0.3), whose row keeps 2 tokens: only they carry a policy loss
    (no KL: beta 0), so they hold 100% of |per-token loss| while the loss stays small (no spike)."""

    def plant(step: int, t: Tensors) -> None:
        if step == 12:
            t["advantages"][:] = 0.0
            t["advantages"][2] = 0.3
            t["completion_mask"][2, 2:] = False

    write_run(tmp_path / "r", 20, plant)
    answer = timeline(tmp_path / "r")
    (few,) = answer["anomalies"]
    assert few["kind"] == "few_tokens" and few["step"] == 12 and sorted(few["tokens"]) == [[2, 0], [2, 1]]
    bd = breakdown(step_files(tmp_path / "r")[12])
    per_token = bd.tokens.loss.double().abs()
    carried, total = float(per_token[2, :2].sum()), float(per_token.sum())
    assert few["value"] == pytest.approx(carried / total, rel=1e-12) and few["value"] == 1.0
    assert few["sentence"] == (
        f"Step 12's loss is carried by 2 of its {7 * WIDTH + 2} tokens: those of row 2 (micro-batch 0) hold "
        f"{number(100 * carried / total, 3)}% of its sum of |per-token loss| ({number(carried)} of {number(total)})."
    )


def test_a_few_token_step_under_the_share_is_not_one(tmp_path: Path) -> None:
    """The same step with 6 tokens in row 2: the top 3 hold about half; at a share of 0.6 it is not an anomaly,
    at 0.4 it is (the threshold decides, nothing else)."""

    def plant(step: int, t: Tensors) -> None:
        if step == 12:
            t["advantages"][:] = 0.0
            t["advantages"][2] = 0.3
            t["completion_mask"][2, 6:] = False

    write_run(tmp_path / "r", 14, plant)
    bd = breakdown(step_files(tmp_path / "r")[12])
    values = sorted(bd.tokens.loss.double().abs().flatten().tolist(), reverse=True)
    share = sum(values[:3]) / sum(values)
    assert 0.4 < share < 0.6
    assert of_kind(timeline(tmp_path / "r", AnomalyThresholds(few_tokens_share=0.6)), "few_tokens") == []
    (few,) = of_kind(timeline(tmp_path / "r", AnomalyThresholds(few_tokens_share=0.4)), "few_tokens")
    assert few["step"] == 12 and few["value"] == pytest.approx(share, rel=1e-12)


# --- a mismatch drift -----------------------------------------------------------------------------------------
@pytest.mark.numerical
def test_a_planted_mismatch_drift_is_found_at_the_first_step_it_holds(tmp_path: Path) -> None:
    """The sampler's log-probs are old + 0.01 noise for 25 steps, then old + 0.05 noise: the mismatch mean
    |old - sampler| is about 5 times the first 10 steps' from step 26 on, so growth 3 holds first at step 26.
    Its tokens are the step file's 3 largest |old - sampler| (a loop over the file's positions)."""

    def plant(step: int, t: Tensors) -> None:
        g = torch.Generator().manual_seed(500 + step)
        scale = 0.01 if step <= 25 else 0.05
        t["sampling_per_token_logps"] = t["old_per_token_logps"] + scale * torch.randn(ROWS, WIDTH, generator=g)

    write_run(tmp_path / "r", 30, plant)
    thresholds = AnomalyThresholds(window=10)
    answer = timeline(tmp_path / "r", thresholds)
    (drift,) = of_kind(answer, "mismatch_growth")
    assert drift["step"] == 26 and drift["series"] == "mismatch_mean"
    files = step_files(tmp_path / "r")

    def mismatch(step: int) -> float:
        batch, _, _ = load_step(files[step])
        assert batch.sampling_per_token_logps is not None and batch.old_per_token_logps is not None
        return float((batch.old_per_token_logps - batch.sampling_per_token_logps).abs().double().mean())

    base = math.fsum(mismatch(s) for s in range(1, 11)) / 10
    assert drift["baseline"] == pytest.approx(base, rel=1e-9)
    assert drift["value"] == pytest.approx(mismatch(26), rel=1e-9)
    batch, _, _ = load_step(files[26])
    assert batch.sampling_per_token_logps is not None and batch.old_per_token_logps is not None
    gap = batch.old_per_token_logps - batch.sampling_per_token_logps
    assert drift["tokens"] == top_tokens(gap, batch.completion_mask, 3)
    value, ratio = drift["value"], drift["value"] / drift["baseline"]
    said = f"|old − sampler| {number(value)} is {number(ratio, 3)} times its mean over the first 10"
    assert said in drift["sentence"]
    assert f"steps ({number(base)})" in drift["sentence"]
    step = next(s for s in answer["steps"] if s["step"] == 26)
    assert step["series"]["mismatch_max"] == pytest.approx(float(gap.abs().max()), rel=1e-12)


# --- a clip jump, an entropy collapse and a KL blow-up ----------------------------------------------------------
def test_a_clip_jump_names_its_series_and_clipped_tokens(tmp_path: Path) -> None:
    """Step 15's ratios move by 0.5 noise (half the tokens leave 1 ± 0.2) after 14 quiet steps (none clipped)."""

    def plant(step: int, t: Tensors) -> None:
        if step == 15:
            g = torch.Generator().manual_seed(7)
            t["per_token_logps"] = t["old_per_token_logps"] + 0.5 * torch.randn(ROWS, WIDTH, generator=g)

    write_run(tmp_path / "r", 16, plant)
    answer = timeline(tmp_path / "r")
    (jump,) = of_kind(answer, "clip_jump")
    bd = breakdown(step_files(tmp_path / "r")[15])
    region = float(bd.metrics["clip_ratio/region_mean"])
    assert jump["step"] == 15 and jump["series"] == "clip_region" and jump["value"] == pytest.approx(region)
    assert jump["baseline"] == 0.0
    clipped = bd.tokens.region >= grpo.REGIONS.index("clip_low")
    assert all(clipped[r, c] for r, c in jump["tokens"]) and len(jump["tokens"]) == 3
    assert f"jumped up to {number(region)} from a mean of 0 over the 14 steps before it" in jump["sentence"]


def test_entropy_collapse_and_kl_blow_up(tmp_path: Path) -> None:
    """Entropies 2 ± 0.1 then 0.5 at step 14 (a quarter of the mean: below half); a reference 0.01 from the
    policy then 1 from it at step 14 (the KL jumps far past 4 standard deviations)."""

    def plant(step: int, t: Tensors) -> None:
        g = torch.Generator().manual_seed(900 + step)
        t["entropies"] = (2.0 if step < 14 else 0.5) + 0.1 * torch.rand(ROWS, WIDTH, generator=g)
        t["ref_per_token_logps"] = t["per_token_logps"] - (0.01 if step < 14 else 1.0) * torch.rand(
            ROWS, WIDTH, generator=g
        )

    write_run(tmp_path / "r", 14, plant, beta=0.04)
    answer = timeline(tmp_path / "r")
    kinds = {a["kind"]: a for a in answer["anomalies"]}
    assert kinds["entropy_collapse"]["step"] == 14 and kinds["kl_blowup"]["step"] == 14
    assert (kinds["entropy_collapse"]["series"], kinds["kl_blowup"]["series"]) == ("entropy", "kl")
    assert {s["name"] for s in answer["series"]} >= {"entropy", "kl"}  # each marked on a chart the answer names
    bd = breakdown(step_files(tmp_path / "r")[14])
    assert bd.entropies is not None
    lowest = min((float(bd.entropies[r, c]), [r, c]) for r in range(ROWS) for c in range(WIDTH))[1]
    assert kinds["entropy_collapse"]["tokens"][0] == lowest
    assert kinds["kl_blowup"]["value"] == pytest.approx(float(bd.metrics["kl"]), rel=1e-12)
    assert kinds["kl_blowup"]["tokens"] == top_tokens(bd.tokens.kl, bd.tokens.mask, 3)


# --- a differ verdict -----------------------------------------------------------------------------------------
def test_a_differ_step_says_both_numbers(tmp_path: Path) -> None:
    """Step 3's file records a trainer loss 0.5 above GRPO Lens's: that step is differ, and its sentence says
    the two losses and their relative error against the tolerance (1e-5)."""
    write_run(tmp_path / "r", 5)
    path = step_files(tmp_path / "r")[3]
    lens = file_loss(path)
    writer = RunWriter(tmp_path / "r", "trl", grpo.LossConfig.from_preset("trl-grpo"), resume=True)
    writer.write_step(3, 0, steady(3), {"loss": lens + 0.5, "processes": 1})
    writer.close()
    answer = timeline(tmp_path / "r")
    (differ,) = answer["anomalies"]
    assert differ["kind"] == "differ" and differ["step"] == 3 and differ["micro"] == 0 and differ["series"] == "loss"
    assert [s["verdict"] for s in answer["steps"]] == ["match", "match", "differ", "match", "match"]
    bd = breakdown(path)
    rel = 0.5 / max(abs(lens + 0.5), float(bd.tokens.loss.abs().sum()))
    assert differ["value"] == pytest.approx(rel, rel=1e-6)
    assert differ["sentence"] == (
        f"Step 3 differs from the trainer: in micro-batch 0, the loss {number(lens)} against the trainer's "
        f"{number(lens + 0.5)} (a difference of {number(differ['value'])}, past 1e-05)."
    )


def test_thresholds_are_checked_and_said() -> None:
    with pytest.raises(ValueError, match="window"):
        AnomalyThresholds(window=0)
    with pytest.raises(ValueError, match="spike_z"):
        AnomalyThresholds(spike_z=float("nan"))
