"""grpo.explain and python -m grpo: the sentences say what the numbers say; the CLI prints the
breakdown of the article's example or of a file."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from reference import HAND, close, evaluate64

import grpo
from grpo.__main__ import main
from grpo.examples import ARTICLE_EXAMPLE
from grpo.explain import explain, summary_table
from grpo.requests import batch_from_request


def test_positive_loss_from_a_negative_surrogate(hand_batch: grpo.Batch) -> None:
    # article on the hand batch: surrogate 2.1/4 - 5.9/6 = -0.4583 < 0, beta·KL 0.0011: loss 0.4594 > 0
    bd = evaluate64(hand_batch, "article")
    first = explain(bd)[0]
    assert first.startswith("The loss is positive (0.4594)") and "-0.4583" in first
    assert any(s.startswith("2 of 5 tokens sit in a flat clip region") for s in explain(bd))


def test_negative_loss_sentence() -> None:
    # every advantage +1 on the hand batch, token mean: min(r, clip(r)) = 1.2, 0.9, 0.5 (r = 0.5 is below
    # the trust region, and A > 0 keeps the lower), 1.1, 1.2: surrogate 4.9 / 5 = 0.98 > 0 = beta·KL
    bd = evaluate64(grpo.Batch(**{**HAND, "advantages": [1.0, 1.0]}), "trl-dapo")
    close(bd.loss, -0.98)
    assert explain(bd)[0] == "The loss is negative (-0.98) because the weighted surrogate 0.98 exceeds beta·KL 0."
    assert "beta = 0: the KL term is off, so the loss is the policy term alone." in explain(bd)


def test_on_policy_sentences() -> None:
    request = {"per_token_logps": [[-1.0, -2.0], [-0.5, -0.25]], "rewards": [1.0, 0.0]}
    bd = grpo.evaluate(batch_from_request(request), grpo.LossConfig(beta=0.0, dtype="float64"))
    sentences = explain(bd)
    assert sentences[0].startswith("The loss is about 0")
    assert any("The ratio is 1 everywhere (on-policy)" in s and "gradient norm" in s for s in sentences)


def test_zero_std_sentence() -> None:
    request = {"per_token_logps": [[-1.0], [-0.5]], "ref_per_token_logps": [[-1.2], [-0.4]], "rewards": [1.0, 1.0]}
    bd = grpo.evaluate(batch_from_request(request))
    assert any(s.startswith("1 group(s) have zero reward std (frac_reward_zero_std = 1)") for s in explain(bd))


def test_summary_table(hand_batch: grpo.Batch) -> None:
    bd = evaluate64(hand_batch, "verl-grpo")
    text = summary_table(bd)
    assert "preset verl-grpo" in text and f"{float(bd.loss): .6g}" in text
    assert "actor/pg_clipfrac_lower" in text
    assert len([line for line in text.splitlines() if line.startswith("    0  ") or line.startswith("    1  ")]) == 2


# --- python -m grpo ---------------------------------------------------------------------------------
def test_cli_article(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    bd = grpo.evaluate(batch_from_request(ARTICLE_EXAMPLE), grpo.LossConfig.from_preset("article"))
    assert "preset article" in out and f"{float(bd.loss): .6g}" in out


def test_cli_eval_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "batch.json"
    path.write_text(json.dumps({**ARTICLE_EXAMPLE, "config": {"preset": "trl-grpo", "beta": 0.04}}))
    assert main(["eval", str(path), "--json", "--set", "epsilon_high=0.28"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["config"]["preset"] == "trl-grpo" and data["config"]["beta"] == 0.04
    assert data["config"]["epsilon_high"] == 0.28
    config = grpo.LossConfig.from_preset("trl-grpo", beta=0.04, epsilon_high=0.28)
    expected = grpo.evaluate(batch_from_request(ARTICLE_EXAMPLE), config)
    assert data["loss"] == float(expected.loss)
    assert data["tokens"]["text"] == ARTICLE_EXAMPLE["tokens"]
    assert main(["eval", str(path), "--preset", "verl-dapo"]) == 0
    assert "preset verl-dapo" in capsys.readouterr().out


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"per_token_logps": [[-1.0, 0.5]], "advantages": [1.0]}))
    assert main(["eval", str(bad)]) == 2
    assert "per_token_logps[0]: expected log-probs <= 0" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "missing.json")]) == 2
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"per_token_logps": [[-1.0]], "advantages": [1.0]}))
    assert main(["eval", str(good), "--set", "beta=-1"]) == 2
    assert "beta: expected a number >= 0.0" in capsys.readouterr().err
