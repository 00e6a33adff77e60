"""The last misleading sentences a newcomer found, read from the answers' structured fields:

- A run whose step files record no rollout (written by today's RunWriter: the lab without its meta, an import, an
  upload) is not said to be "captured before GRPO Lens recorded the rollout": its files do not record it, and the
  sentence names the writers that do.
- Without old_per_token_logps but with the sampler's, the warning does not say "on-policy": π_old is π (the ratio
  is 1), yet the sampler differs and the rollout correction compares π_old with it.
- Under a verl preset the metrics table's sampling/importance_sampling_ratio/* is described as what TRL would log,
  not as "the weight TRL applied" (no TRL run applied it); under a TRL preset it stays TRL's.
- Compare says when a column leaves the batch's sampler log-probs out (a preset with no rollout correction), and
  when the columns correct differently.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from api_fixtures import client
from test_runview import write

from app.runview import run_overview
from grpo.runs import load_run

# Two rows of two tokens; the sampler differs from the policy at row 0 token 0 (by 0.2) and row 1 token 1 (by 0.2).
OFF_POLICY = {
    "per_token_logps": [[-0.5, -1.0], [-0.2, -0.3]],
    "sampling_per_token_logps": [[-0.7, -1.0], [-0.2, -0.1]],
    "advantages": [1.0, -1.0],
}


def _post(path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client().post(path, json=body)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_run_without_rollout_records_says_its_files_do_not_record_it(tmp_path: Path) -> None:
    """A run written now by RunWriter with no rollout meta: the sentence says what its files lack and which
    writers record it, not that it predates the recording."""
    steps = run_overview(load_run(write(tmp_path, {1: {}})))["steps"]
    text = steps[0]["rollout"]["text"]
    assert steps[0]["rollout"]["rollout"] is None and text.startswith("rollout unknown")
    assert "captured before" not in text
    assert "do not record" in text and "TRL capture" in text and "lab" in text


@pytest.mark.numerical
def test_without_old_logps_a_differing_sampler_is_not_called_on_policy() -> None:
    """π_old = π: every ratio is 1 (exp(0)); the sampler differs, so the token-level IS weight of row 0 token 0
    is exp(old − sampler) = exp(−0.5 − (−0.7)) = e^0.2 ≈ 1.2214 (token_truncate, below C_max 3)."""
    answer = _post(
        "/api/v1/loss", {**OFF_POLICY, "config": {"preset": "trl-grpo", "rollout_correction": "token_truncate"}}
    )
    assert [r for row in answer["tokens"]["ratio"] for r in row] == [1.0, 1.0, 1.0, 1.0]
    assert answer["mismatch"] is not None
    first = answer["tokens"]["is_weight"][0][0]
    assert first == pytest.approx(math.exp(0.2), rel=1e-6)  # float32 exp of 0.2: relative error ~1e-7
    said = [w for w in answer["warnings"] if w.startswith("No old_per_token_logps")]
    assert len(said) == 1
    assert "on-policy" not in said[0]
    assert "sampling_per_token_logps" in said[0] and "compares π_old with the sampler" in said[0]


def test_without_any_old_or_sampler_logps_the_batch_is_on_policy() -> None:
    """The plain case keeps its sentence: no old and no sampler log-probs is on-policy."""
    body = {k: v for k, v in OFF_POLICY.items() if k != "sampling_per_token_logps"}
    answer = _post("/api/v1/loss", {**body, "config": {"preset": "trl-grpo"}})
    assert "No old_per_token_logps: on-policy, so the ratio is 1 everywhere and nothing can clip." in answer["warnings"]


@pytest.mark.parametrize(
    ("preset", "said", "not_said"),
    [
        ("verl-grpo", "What TRL would log", "TRL applied"),
        ("trl-grpo", "The rollout-correction weight TRL applied", "would log"),
    ],
)
def test_the_is_ratio_metric_is_described_as_whose_it_is(preset: str, said: str, not_said: str) -> None:
    """The metrics table lists sampling/importance_sampling_ratio/* whenever a correction is chosen (the table
    lists by objective, with each trainer's name in its columns); its meaning says whose weight it is."""
    config = {"preset": preset, "rollout_correction": "token_truncate"}
    answer = _post("/api/v1/loss", {**OFF_POLICY, "config": config})
    assert "sampling/importance_sampling_ratio/mean" in answer["metrics_logged"]
    parts = answer["metric_meaning_parts"]["sampling/importance_sampling_ratio/mean"]
    text = "".join(p if isinstance(p, str) else str(p.get("text", "")) for p in parts)
    assert said in text and not_said not in text


def test_compare_notes_a_column_that_leaves_the_sampler_out() -> None:
    """trl-grpo with sequence_mask corrects; verl-grpo as its preset has none: one note for verl-grpo (no
    correction) and one for trl-grpo (the columns correct differently)."""
    configs = [{"preset": "trl-grpo", "rollout_correction": "sequence_mask"}, {"preset": "verl-grpo"}]
    answer = _post("/api/v1/compare", {**OFF_POLICY, "configs": configs})
    notes = {n["preset"]: n for n in answer["notes"]}
    assert set(notes) == {"trl-grpo", "verl-grpo"}
    assert notes["verl-grpo"]["correction"] is None and "applies no rollout correction" in notes["verl-grpo"]["text"]
    assert notes["trl-grpo"]["correction"].startswith("rollout_correction sequence_mask")
    # the notes are the answer's, beside columns whose losses differ by the correction
    losses = [r["loss"] for r in answer["results"]]
    assert losses[0] != losses[1]


def test_compare_says_nothing_without_sampler_logps_or_when_all_correct_alike() -> None:
    body = {k: v for k, v in OFF_POLICY.items() if k != "sampling_per_token_logps"}
    plain = _post("/api/v1/compare", {**body, "configs": [{"preset": "trl-grpo"}, {"preset": "verl-grpo"}]})
    assert plain["notes"] == []
    alike = [{"preset": p, "rollout_correction": "token_truncate"} for p in ("trl-grpo", "verl-grpo")]
    assert _post("/api/v1/compare", {**OFF_POLICY, "configs": alike})["notes"] == []
