"""The page explains itself, round three, the rest: the answer's structured fields and sentences for a run, a
correction scenario and a GMPO batch, read as a newcomer reads the page.

- A token's region as the page names it (tokens.bound, into why.names): "unbounded" for a ratio past the trust
  region that no clip holds, where the region code says "trust" (the CSV's region column reads it).
- At ratio 1 with a rollout correction, the policy part is minus the weighted mean of A times each row's
  correction weight, not "minus the weighted mean advantage (on-policy)"; the tokens a mask mode kept keep their IS
  weight (1.17 to 1.2 here), not "their weight" read as 1.
- Under GMPO, the unbounded token that carries the loss is in the summary.
- actor/ppo_kl measures the move from the old policy, not from "the sampling policy" (a separate sampler's
  log-probs differ from it); actor/kl_loss names its aggregation once.
- A one-token row is "1 token", not "1 tokens"."""

from __future__ import annotations

import math
from typing import Any

import pytest
from api_fixtures import client

from grpo.examples import SCENARIOS

LOG_49 = math.log(49.0)
# Ratio 49 with A < 0 under the article's clip (ε 0.2, no dual clip, no delta): min(49·A, 1.2·A) = 49·A.
UNBOUNDED = {
    "per_token_logps": [[-0.1, -0.2], [-0.3, -0.4]],
    "old_per_token_logps": [[-0.1 - LOG_49, -0.2], [-0.3, -0.4]],
    "advantages": [-1.0, 1.0],
}


def _loss(body: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    response = client().post("/api/v1/loss", json={**body, "config": config})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _scenario(name: str) -> dict[str, Any]:
    s = SCENARIOS[name]
    return _loss(s.request, {"preset": s.preset, **s.overrides})


def _sentence(answer: dict[str, Any], key: str) -> str:
    return str(answer["explanation"][answer["explanation_keys"].index(key)])


@pytest.mark.numerical
def test_a_tokens_region_is_named_as_the_page_names_it() -> None:
    """tokens.bound names the bound that acted on each token, into why.names; row 0 position 0 (ratio 49, A = -1)
    is "unbounded" there and in its why, while the region code keeps "trust" (the API's parity with the trainers).
    Row 1 position 0 (ratio 1, A = 1) is trust in both; nothing is laid over a bound here, so bound = why."""
    answer = _loss({**UNBOUNDED, "advantages": [-1.0, 1.0]}, {"preset": "article"})
    t, names = answer["tokens"], answer["why"]["names"]
    assert t["ratio"][0][0] == pytest.approx(49.0, rel=1e-5)
    assert t["region"][0] == ["trust", "trust"] and t["region"][1] == ["trust", "trust"]
    bound = t.get("bound", t["why"])  # sent only where a token's why is not its bound
    assert [[names[c] for c in row] for row in bound] == [["unbounded", "trust"], ["trust", "trust"]]
    assert answer["why"]["counts"]["unbounded"] == 1


@pytest.mark.numerical
def test_a_bound_under_a_why_laid_over_it_is_kept_apart() -> None:
    """A = 0 on row 0 (its why: zero_advantage, no policy gradient) at ratio 49: its bound is still the objective's
    reading of that token (trust: with A = 0 nothing is clipped), so the answer carries tokens.bound; a token that
    a correction dropped keeps its bound too (the long-row scenario: row 3 dropped, its tokens' bound trust)."""
    answer = _loss({**UNBOUNDED, "advantages": [0.0, 1.0]}, {"preset": "article"})
    names = answer["why"]["names"]
    assert names[answer["tokens"]["why"][0][0]] == "zero_advantage"
    assert names[answer["tokens"]["bound"][0][0]] == "trust"
    long_row = _scenario("mismatch-long-row")
    names = long_row["why"]["names"]
    assert {names[c] for c in long_row["tokens"]["why"][3]} == {"is_dropped"}
    assert {names[c] for c in long_row["tokens"]["bound"][3]} == {"trust"}


@pytest.mark.numerical
def test_at_ratio_1_a_corrected_policy_part_is_said_with_its_weights() -> None:
    """mismatch-long-row under TRL's sequence_mask (C_max 3): π = π_old (ratio 1), rows 0-2 keep their sequence
    weight exp(Σ old − sampler) (1.17 to 1.2), row 3 (ratio 3.45) is dropped. seq-mean-token-mean with one A per row
    and one weight w_i per row: policy = −(1/4) Σ_i A_i · w_i (each row's token mean of −A_i·w_i is −A_i·w_i), which
    is not −(1/4) Σ_i A_i over the kept rows: the sentence says each A enters times its weight, and the batch is not
    "on-policy" beside a sampler that differs."""
    answer = _scenario("mismatch-long-row")
    rows = answer["rows"]
    derived = -sum(a * w for a, w in zip(rows["advantage"], rows["rollout_weight"], strict=True)) / 4
    assert rows["rollout_weight"][3] == 0 and rows["rollout_dropped"][3] == 40
    assert answer["policy_loss"] == pytest.approx(derived, rel=1e-5)
    unweighted = -sum(a for a, w in zip(rows["advantage"], rows["rollout_weight"], strict=True) if w) / 4
    assert abs(answer["policy_loss"] - unweighted) > 0.03  # 0.2509 against 0.2165: the weights matter
    said = _sentence(answer, "on_policy")
    assert "(on-policy)" not in said and "sampler's log-probs differ" in said
    assert "times its rollout-correction weight" in said and "minus the weighted mean advantage" not in said
    # the kept rows' weights are exp(Σ old − sampler) as they are (a mask mode does not truncate): not 1
    kept = [w for w in rows["rollout_weight"] if w]
    assert f"16 token(s) kept their IS weight as it is ({min(kept):.4g} to {max(kept):.4g})" in _sentence(
        answer, "correction"
    )
    plain = _scenario("on-policy")  # no sampler, no correction: on-policy, minus the weighted mean advantage
    assert "(on-policy), so the policy part is minus the weighted mean advantage" in _sentence(plain, "on_policy")


@pytest.mark.numerical
def test_a_gmpo_batchs_unbounded_token_is_in_the_summary() -> None:
    """The article's batch under verl-gmpo: row 0 (A = -1) has a token at ratio 52.49, log-ratio 3.96 > ε_high 0.4:
    nothing bounds it, and row 0's loss share (2.916) exceeds the whole loss (2.086). The summary said only "2
    clipped high"; it now counts the unbounded token, with its ratio, as the why counts do."""
    answer = _loss(SCENARIOS["article"].request, {"preset": "verl-gmpo"})
    assert answer["why"]["counts"]["unbounded"] == 1
    said = _sentence(answer, "unbounded")
    assert said.startswith("1 token(s) (ratio up to 52.49) are unbounded: A < 0"), said
    names = answer["why"]["names"]
    ratios = [
        r
        for row_r, row_w in zip(answer["tokens"]["ratio"], answer["tokens"]["why"], strict=True)
        for r, w in zip(row_r, row_w, strict=True)
        if names[w] == "unbounded"
    ]
    assert ratios == [pytest.approx(52.49, rel=1e-3)]
    assert answer["rows"]["loss"][0] > answer["loss"] > 0


def test_the_metrics_meanings_say_what_they_measure() -> None:
    """actor/ppo_kl is mean(log π_old − log π_θ): the move from the old policy; in an off-policy batch the sampler's
    log-probs are another policy (mismatch-long-row: |old − sampler| 0.031 per token), so "from the sampling policy"
    was false there. actor/kl_loss named its aggregation twice ("(token-mean) (seq-mean-token-mean, for one: ...")."""
    answer = _scenario("mismatch-long-row")
    meaning = {
        k: "".join(p if isinstance(p, str) else p["text"] for p in v) for k, v in answer["metric_meaning_parts"].items()
    }
    assert "sampling policy" not in meaning["actor/ppo_kl"] and "from the old one" in meaning["actor/ppo_kl"]
    gmpo = _loss(SCENARIOS["article"].request, {"preset": "verl-gmpo"})
    kl_loss = "".join(p if isinstance(p, str) else p["text"] for p in gmpo["metric_meaning_parts"]["actor/kl_loss"])
    assert "for one" not in kl_loss and ") (" not in kl_loss
    assert "with its aggregation (token-mean): under seq-mean-token-mean" in kl_loss, kl_loss


def test_a_one_token_row_is_one_token() -> None:
    """Rows of 1 and 3 tokens under the article's seq-mean-token-mean: the shortest row is "1 token", and its token
    weighs 1 / (B · 1) = 0.5 (B = 2 rows)."""
    body = {"per_token_logps": [[-0.5], [-0.5, -0.6, -0.7]], "advantages": [1.0, -1.0]}
    said = _sentence(_loss(body, {"preset": "article"}), "length")
    assert said.startswith("Per token, the shortest row (row 0, 1 token) weighs 0.5"), said
