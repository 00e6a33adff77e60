"""The corrections' sentences and fields are true for the batch shown (Corrections): a dropped token's
why says it gets no policy gradient, the scatter's title names every correction in force (rollout_rs too), the
k1 bounds are said to bound −log r, the summary names the dropped row, the rows table carries the sampler ratio
and the row's weight, a TRL preset without TRL's vLLM correction says so, and the counts agree across the
summary, the rows table, the hovers' codes and the Mismatch view. Read from /api/v1/loss's answer."""

from __future__ import annotations

import math
from typing import Any

import pytest
from api_fixtures import client

from grpo.config import PRESETS
from grpo.examples import SCENARIOS

LONG = SCENARIOS["mismatch-long-row"]
# TRL's default (sequence_mask, C_max 3) drops row 3 (ratio 3.447); verl's token_k1 on [0.965, 1.1] rejects 19
RS = {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.965_1.1"}


def _answer(**config: Any) -> dict[str, Any]:
    body = {**LONG.request, "config": {"preset": LONG.preset, **LONG.overrides, **config}}
    r = client().post("/api/v1/loss", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def answer() -> dict[str, Any]:
    return _answer(**RS)


def _tagged(parts: list[Any]) -> dict[str, float]:
    return {p["quantity"]: p["value"] for p in parts if isinstance(p, dict)}


def test_a_dropped_tokens_why_says_it_gets_no_policy_gradient(answer: dict[str, Any]) -> None:
    why, tokens = answer["why"], answer["tokens"]
    names = why["names"]
    row = 3  # dropped whole by sequence_mask
    codes = [names[c] for c, m in zip(tokens["why"][row], tokens["mask"][row], strict=True) if m]
    assert codes and set(codes) == {"is_dropped"}, codes
    text = why["texts"]["is_dropped"]
    assert "no policy gradient" in text and "gets a policy gradient" not in text and "sequence_mask" in text
    assert "is_dropped" in why["no_gradient"]
    grads = [g for g, m in zip(tokens["grad_policy"][row], tokens["mask"][row], strict=True) if m]
    assert grads and all(g == 0 for g in grads)
    # a rejected token (it left the batch) is named as rollout_rs's, not as padding
    rejected = answer["correction_names"].index("rejected")
    for i, row_codes in enumerate(tokens["correction"]):
        for j, c in enumerate(row_codes):
            if c == rejected:
                assert names[tokens["why"][i][j]] == "rs_rejected"
    assert "rollout_rs" in why["texts"]["rs_rejected"] and "leaves the batch" in why["texts"]["rs_rejected"]


def test_the_scatter_title_names_rollout_rs_when_no_is_weight_is_chosen() -> None:
    a = _answer(rollout_correction="none", **RS)
    m = a["mismatch"]
    assert m["counts"]["rejected"] > 0
    assert m["correction_label"] != "no correction"
    assert "rollout_rs token_k1" in m["correction_label"]
    assert f"{m['counts']['rejected']} tokens rejected" in m["correction_label"]
    assert m["is_label"] == "no correction"


def test_k1_bounds_are_said_to_bound_minus_log_r(answer: dict[str, Any]) -> None:
    m = answer["mismatch"]
    k1 = [t for t in m["thresholds"] if t["name"].startswith("token_k1")]
    assert len(k1) == 2
    for t in k1:
        assert "−log r = sampler − old" in t["bounds"] and "ratio bound" not in t["bounds"]
        # r's own bound is the inverse one: r <= 1/lower, r >= 1/upper
        side = t["name"].split()[-1]
        assert f"r = exp(old − sampler) {'≤' if side == 'lower' else '≥'} 1/{side}" in t["bounds"], t
    lines = [line for line in m["scatter"]["lines"] if "token_k1" in line["label"]]
    assert {round(line["offset"], 6) for line in lines} == {round(math.log(0.965), 6), round(math.log(1.1), 6)}
    assert all("−log r" in line["label"] for line in lines)
    # the bounds hold on −log r = sampler − old: every kept scored token lies between them, every rejected outside
    s = m["scatter"]
    rejected = answer["correction_names"].index("rejected")
    for x, y, code in zip(s["x"], s["y"], s["code"], strict=True):
        inside = math.log(0.965) <= y - x <= math.log(1.1)
        assert inside == (code != rejected), (x, y, code)


def test_the_summary_names_the_dropped_row_and_the_rejected_tokens(answer: dict[str, Any]) -> None:
    keys = answer["explanation_keys"]
    assert "correction" in keys
    i = keys.index("correction")
    text, numbers = answer["explanation"][i], _tagged(answer["explanation_parts"][i])
    assert "sequence_mask dropped" in text and "the whole of row 3" in text and "rollout_rs rejected" in text
    assert numbers["rows/index/3"] == 3
    counts = answer["mismatch"]["counts"]
    for name in ("masked", "rejected", "kept"):
        assert numbers[f"mismatch/counts/{name}"] == counts[name], name
    assert numbers["loss_without_correction"] == answer["loss_without_correction"]
    # the no-gradient sentence counts them as the correction's, not as bounded tokens
    clip = answer["explanation"][keys.index("clip")]
    assert "dropped by the rollout correction" in clip and "on the bounded ones" not in clip


def test_the_rows_table_shows_the_sampler_ratio_and_the_rows_weight(answer: dict[str, Any]) -> None:
    rows, block = answer["rows"], answer["mismatch"]["rows"]
    assert rows["rollout_is_ratio"] == pytest.approx(block["is_ratio"])
    assert rows["rollout_is_ratio"][3] > 3 and rows["rollout_weight"][3] == 0
    assert rows["rollout_dropped"][3] == rows["length"][3] == 26
    assert rows["sequence_ratio"][3] == pytest.approx(1.0)  # the policy's ratio: on-policy, kept apart


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.startswith("trl")])
def test_a_trl_preset_says_what_it_leaves_out(preset: str) -> None:
    body = {**LONG.request, "config": {"preset": preset}}
    a = client().post("/api/v1/loss", json=body).json()
    assert a["config"]["rollout_correction"] == "none"
    text = a["explanation"][a["explanation_keys"].index("trl_correction")]
    for words in ("use_vllm", "sequence_mask", "rollout_is_max = 3", "no rollout correction"):
        assert words in text, words
    on = client().post("/api/v1/loss", json={**body, "config": {"preset": preset, **LONG.overrides}}).json()
    assert "trl_correction" not in on["explanation_keys"]
    verl = client().post("/api/v1/loss", json={**body, "config": {"preset": "verl-grpo"}}).json()
    assert "trl_correction" not in verl["explanation_keys"]


@pytest.mark.parametrize(
    "config",
    [
        RS,
        {"rollout_correction": "none", **RS},
        {"rollout_correction": "token_mask", "rollout_is_min": 0.98, "rollout_is_max": 1.04},
        {"off_policy_mask_threshold": 0.0, **RS},
    ],
)
def test_the_corrections_counts_agree_across_the_page(config: dict[str, Any]) -> None:
    """Summary (its tagged counts), rows table (per-row sums), hovers (the why codes) and the Mismatch view (its
    counts, its rejection sentence) tell the same numbers."""
    a = _answer(**config)
    m = a["mismatch"]
    counts = m["counts"]
    dropped = counts["masked"] + counts["sequence_masked"]
    assert sum(a["rows"]["rollout_dropped"]) == dropped
    assert sum(a["rows"]["rollout_rejected"]) == counts["rejected"]
    names = a["why"]["names"]
    codes = [names[c] for row in a["tokens"]["why"] for c in row]
    assert codes.count("is_dropped") == counts["masked"]
    assert codes.count("off_policy_dropped") == counts["sequence_masked"]
    assert codes.count("rs_rejected") == counts["rejected"]
    assert a["why"]["counts"].get("is_dropped", 0) == counts["masked"]
    keys = a["explanation_keys"]
    if dropped or counts["rejected"] or counts["truncated"]:
        numbers = _tagged(a["explanation_parts"][keys.index("correction")])
        for name, n in counts.items():
            if f"mismatch/counts/{name}" in numbers:
                assert numbers[f"mismatch/counts/{name}"] == n, name
        assert numbers.get("mismatch/counts/rejected", 0) == counts["rejected"]
    if counts["rejected"]:
        assert m["stats"]["rejected_tokens"] == counts["rejected"]
        assert f"{counts['rejected']} tokens rejected" in m["correction_label"]
    assert sum(a["why"]["counts"].values()) == a["metrics"]["lens/num_tokens"]
