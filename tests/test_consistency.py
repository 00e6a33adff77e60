"""One definition per quantity: every number the answer prints in a sentence, a count or a description
agrees with the same quantity wherever else the answer carries it, for every scenario under every preset;
and no description holds a literal setting value (one story per number, at the data level)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import pytest
import torch

import grpo
from grpo.answer import breakdown_to_json
from grpo.examples import SCENARIOS, scenario_batch
from grpo.explain import explain_items, number, token_why
from grpo.glossary import GLOSSARY, SETTINGS, metric_meanings

CASES = (
    [(s, p) for s in SCENARIOS for p in grpo.PRESETS]
    + [(s, "article+dual_clip") for s in SCENARIOS]
    + [(s, "article+delta") for s in SCENARIOS]
)


def _config(scenario: str, preset: str) -> grpo.LossConfig:
    extra = {"+dual_clip": {"dual_clip": 3.0}, "+delta": {"delta": 2.0}}
    name, _, variant = preset.partition("+")
    own = SCENARIOS[scenario].overrides if name == SCENARIOS[scenario].preset else {}
    return grpo.LossConfig.from_preset(name, dtype="float64", **{**own, **extra.get(f"+{variant}", {})})


def _lookup(answer: dict[str, Any], quantity: str) -> float | None:
    """The answer's own value of a quantity named by its path (metrics/kl, rows/loss/2, config/beta);
    None for a quantity only a sentence shows (lens/why/...)."""
    head, _, rest = quantity.partition("/")
    if head in ("loss", "policy_loss", "kl_loss", "objective") and not rest:
        return float(answer[head])
    if head == "weighted_surrogate":
        return -float(answer["policy_loss"])
    if head == "metrics":
        return float(answer["metrics"][rest])
    if head == "rows":
        field, _, i = rest.rpartition("/")
        return float(i) if field == "index" else float(answer["rows"][field][int(i)])
    if head == "zero_std_groups":
        return float(answer["zero_std_groups"][int(rest)])
    if head == "config":
        if rest == "1+epsilon_high":
            return 1 + float(answer["config"]["epsilon_high"])
        return float(answer["config"][rest])
    if head == "clamp_counts":
        return float(answer["clamp_counts"][rest])
    if head == "why":
        return (
            float(answer["why"]["counts"][rest])
            if rest != "no_gradient"
            else float(sum(n for k, n in answer["why"]["counts"].items() if k in answer["why"]["no_gradient"]))
        )
    if quantity == "lens/num_tokens":
        return float(answer["metrics"]["lens/num_tokens"])
    if head == "mismatch" and rest.startswith("counts/"):  # the summary's correction counts: the Mismatch view's
        return float(answer["mismatch"]["counts"][rest.removeprefix("counts/")])
    if head == "loss_without_correction":
        return float(answer["loss_without_correction"])
    assert head == "lens", quantity  # a quantity of the sentence's own (a ratio's range, a share)
    return None


# Digits a text piece may hold outside a tagged number: names with digits (k1, float64, token_k1), "row 2", and
# the constants 0 and 1 of formulas (A > 0, ratio above 1); the browser test reads the page the same way.
UNTAGGED_DIGITS = re.compile(r"\brows? \d+|[A-Za-z_./-]*[A-Za-z_][A-Za-z_./-]*\d+[A-Za-z_./\d-]*|\b[01]\b")


def _check_parts(answer: dict[str, Any], sentences: list[list[Any]], texts: list[str]) -> None:
    """Sentences as parts: their text is the answer's, each number is tagged, prints its value, and equals the
    answer's own value of its quantity; no digit is left untagged."""
    for parts, text in zip(sentences, texts, strict=True):
        assert "".join(p if isinstance(p, str) else p["text"] for p in parts) == text
        for p in parts:
            if isinstance(p, str):
                assert not re.search(r"\d", UNTAGGED_DIGITS.sub("", p)), (p, text)
                continue
            if p["text"].endswith("%"):  # a share, printed as a percentage
                assert float(p["text"][:-1]) / 100 == pytest.approx(p["value"], rel=5e-3, abs=5e-4), p
            else:
                assert p["text"] == number(p["value"], len(p["text"])) or float(p["text"]) == pytest.approx(
                    p["value"], rel=5e-3, abs=1e-12
                ), p
            value = _lookup(answer, p["quantity"])
            if value is not None:
                assert p["value"] == pytest.approx(value, rel=1e-12, abs=1e-15), p


@pytest.mark.parametrize(("scenario", "preset"), CASES)
def test_every_number_agrees_across_the_answer(scenario: str, preset: str) -> None:
    bd = grpo.evaluate(scenario_batch(scenario), _config(scenario, preset))
    answer = breakdown_to_json(bd)
    why = token_why(bd)
    # the sentences and the warnings: each number is tagged, prints its value, and equals the answer's own value
    _check_parts(answer, answer["explanation_parts"], answer["explanation"])
    _check_parts(answer, answer["warning_parts"], answer["warnings"])
    # the why: one code per counted token, counted once; the counts are the answer's
    codes = [answer["why"]["names"][c] for row in answer["tokens"]["why"] for c in row]
    assert {k: codes.count(k) for k in answer["why"]["counts"]} == answer["why"]["counts"]
    assert sum(answer["why"]["counts"].values()) == answer["metrics"]["lens/num_tokens"]
    # "no policy gradient" means it: those tokens get none, the others (with a weight and A != 0) do
    silent = torch.zeros_like(bd.tokens.mask)
    for name in why.no_gradient:
        silent |= why.codes == why.names.index(name)
    assert float(bd.tokens.grad_policy[silent].abs().sum()) == 0
    # the clip metrics count exactly the why's clipped tokens (token-level ratio, every TRL-reduced flag)
    n = int(bd.tokens.mask.sum())
    counts = why.counts()
    if bd.config.objective == "clip" and bd.config.importance_sampling_level == "token" and bd.config.delta is None:
        clipped = counts["clip_low"] + counts["clip_high"]
        assert bd.metrics["clip_ratio/region_mean"] == pytest.approx(clipped / n)
        assert bd.metrics["actor/pg_clipfrac"] == pytest.approx(clipped / n)
        if bd.config.dual_clip is not None:
            assert bd.metrics["actor/pg_clipfrac_lower"] == pytest.approx(counts["dual_clip"] / n)
    # one meaning per metric key, under this config
    assert set(answer["metric_meaning_parts"]) <= set(answer["metrics"])


def test_each_metric_has_one_meaning() -> None:
    keys = [k for term in GLOSSARY for k in term.keys]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)


# --- literal values ---------------------------------------------------------------------------------
# Two configs that differ in every numeric setting: a description that names a setting must change.
A = grpo.LossConfig(
    epsilon_low=0.2,
    epsilon_high=0.28,
    dual_clip=3.0,
    delta=2.5,
    beta=0.04,
    advantage="group",
    cispo_bounds="relative",
    aggregation="seq-mean-token-mean",
)
B = grpo.LossConfig(
    epsilon_low=0.1,
    epsilon_high=0.35,
    dual_clip=4.5,
    delta=3.5,
    beta=0.002,
    advantage="batch",
    cispo_bounds="relative",
    aggregation="token-mean",
    clip_cov_ratio=0.001,
    clip_cov_lb=0.5,
    clip_cov_ub=4.0,
    kl_cov_ratio=0.001,
    ppo_kl_coef=0.2,
)
NAMES = ("ε_high", "ε_low", "epsilon", "dual_clip", "clip_ratio_c", "delta", "beta", "aggregation", "advantage =")


def _names_a_setting(text: str) -> bool:
    return any(name in text for name in NAMES)


def test_every_numeric_setting_differs_between_the_two_configs() -> None:
    for f in dataclasses.fields(grpo.LossConfig):
        a, b = getattr(A, f.name), getattr(B, f.name)
        if f.name in {"epsilon_low", "epsilon_high", "dual_clip", "delta", "beta"}:
            assert a != b, f.name


def test_metric_meanings_follow_the_config() -> None:
    a, b = metric_meanings(A), metric_meanings(B)
    for term in GLOSSARY:
        named = [k for k in SETTINGS if "{" + k + "}" in term.template]
        for key in term.keys:
            assert bool(named) == _names_a_setting(a[key]), key
            if named:
                assert a[key] != b[key], key
            # no literal number next to a setting's name: each value printed is the config's
            want = {
                "1 + ε_high": 1 + A.epsilon_high,
                "1 - ε_low": 1 - A.epsilon_low,
                "ε_high": A.epsilon_high,
                "dual_clip)": A.dual_clip,
                "beta": A.beta,
            }
            for m in re.finditer(r"(1 \+ ε_high|1 - ε_low|(?<![+-] )ε_high|dual_clip\)|beta) = (-?[\d.]+\d)", a[key]):
                assert float(m[2]) == pytest.approx(want[m[1]]), (key, m[0])
    assert "clip_ratio_c = 3" not in " ".join(term.meaning for term in GLOSSARY)


def test_why_texts_follow_the_config() -> None:
    for objective in grpo.OBJECTIVES.names():
        rule = grpo.OBJECTIVES.entry(objective).why
        if rule is None:
            continue
        for name, template in rule.texts.items():
            if "{" in template:
                from_a = template.format_map({k: v for k, v in rule.values(A.replace(objective=objective)).items()})
                from_b = template.format_map({k: v for k, v in rule.values(B.replace(objective=objective)).items()})
                assert from_a != from_b, (objective, name)
            else:
                assert not re.search(r"\d", template.replace("1 − ε", "").replace("1 + ε", "")), (objective, name)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sentences_name_no_setting_value_but_the_configs(scenario: str) -> None:
    """A sentence naming a setting changes with it; a value printed beside a setting's name is the config's."""
    for config in (A, B):
        for _, text in explain_items(grpo.evaluate(scenario_batch(scenario), config.replace(dtype="float64"))):
            for m in re.finditer(r"(1 \+ ε_high|beta) = (-?[\d.e+-]+)", text):
                want = 1 + config.epsilon_high if m[1] != "beta" else config.beta
                assert float(m[2].rstrip(".")) == pytest.approx(want, rel=1e-4), (text, m[0])


def test_number_keeps_the_digits_that_tell_it_from_one() -> None:
    assert number(1 + 4e-4) == "1.0004" and number(1 - 3e-4) == "0.9997"
    assert number(1.2) == "1.2" and number(52.4912) == "52.49" and number(1.0) == "1" and number(-0.0) == "0"
    assert number(1202604.26) == "1.203e+06" and number(3.0) == "3" and math.isnan(float(number(math.nan)))


# --- warnings: every number tagged (before, warnings were plain strings) ---------------------
def _warned_batches() -> list[tuple[str, grpo.Batch, grpo.LossConfig]]:
    """A batch and a config for each warning that prints a number."""
    from grpo.requests import batch_from_request

    ragged = {
        "per_token_logps": [[-0.5, -1.0], [-0.3, -0.8], [-0.2, -0.1], [-1.2, -0.4]],
        "old_per_token_logps": [[-0.6, -0.9], [-0.2, -0.9], [-0.4, -0.3], [-1.0, -0.5]],
        "ref_per_token_logps": [[-0.4, -1.1], [-0.4, -0.7], [-0.3, -0.2], [-1.1, -0.6]],
        "completion_mask": [[1, 1], [0, 0], [1, 1], [1, 0]],
        "rewards": [1.0, 1.0, 0.0, 1.0],
    }
    batch = batch_from_request({**ragged, "group_size": 2})  # group 0's rewards are equal: zero std
    single = batch_from_request({**ragged, "group_size": 1})
    unscored = batch_from_request(
        {**ragged, "sampling_per_token_logps": [[-0.6, None], [-0.2, -0.9], [-0.4, -0.3], [-1.0, -0.5]]}
    )
    huge = batch_from_request(  # logp - old = 99.5: a ratio past float32's range
        {**ragged, "old_per_token_logps": [[-100.0, -0.9], [-0.2, -0.9], [-0.4, -0.3], [-1.0, -0.5]]}
    )
    f64 = {"dtype": "float64"}
    return [
        ("zero std, empty row, beta 0", batch, grpo.LossConfig.from_preset("trl-grpo", **f64)),
        ("group_size 1", single, grpo.LossConfig.from_preset("verl-grpo", **f64)),
        ("cispo", batch, grpo.LossConfig.from_preset("trl-cispo", epsilon_high=0.2, **f64)),
        ("constant", batch, grpo.LossConfig.from_preset("trl-dr_grpo", max_completion_length=512, **f64)),
        ("unscored", unscored, grpo.LossConfig.from_preset("trl-grpo", rollout_correction="token_truncate", **f64)),
        ("overflow", huge, grpo.LossConfig.from_preset("trl-grpo", dtype="float32")),
    ]


@pytest.mark.parametrize("case", _warned_batches(), ids=lambda c: c[0])
def test_every_number_in_a_warning_is_tagged(case: tuple[str, grpo.Batch, grpo.LossConfig]) -> None:
    _, batch, config = case
    bd = grpo.evaluate(batch, config)
    answer = breakdown_to_json(bd)
    assert answer["warnings"] == list(bd.warnings) and len(answer["warning_parts"]) == len(bd.warnings)
    numbers = [p for parts in answer["warning_parts"] for p in parts if not isinstance(p, str)]
    assert numbers, answer["warnings"]  # each case's warning prints a number
    _check_parts(answer, answer["warning_parts"], answer["warnings"])


def test_the_metrics_table_lists_what_the_objective_logs() -> None:
    """Before: every objective's metrics were listed at 0 (vespo/phi_seq_mean, cispo_clip_ratio under kl_cov).
    Now the table lists the metrics the config's objective reports (its registry entry) and those no objective
    claims; the answer's metrics still hold them all (check-run compares them)."""
    claimed = {name for entry in grpo.OBJECTIVES.entries() for name in entry.metrics}
    for objective in grpo.OBJECTIVES.names():
        config = grpo.LossConfig(objective=objective, dtype="float64", dro_beta=0.1)
        bd = grpo.evaluate(scenario_batch("off-policy-clipping"), config)
        answer = breakdown_to_json(bd)
        logged = answer["metrics_logged"]
        assert set(logged) <= set(answer["metrics"]) and set(answer["metrics"]) >= claimed
        assert set(logged) & claimed == set(grpo.OBJECTIVES.entry(objective).metrics), objective
        assert set(answer["metrics"]) - set(logged) <= claimed
    kl_cov = breakdown_to_json(grpo.evaluate(scenario_batch("article"), grpo.LossConfig.from_preset("verl-kl_cov")))
    assert "vespo/phi_seq_mean" not in kl_cov["metrics_logged"] and "cispo_clip_ratio" not in kl_cov["metrics_logged"]
    assert "actor/ppo_kl" in kl_cov["metrics_logged"] and kl_cov["metrics"]["vespo/phi_seq_mean"] == 0
