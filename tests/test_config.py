"""grpo.config: LossConfig's defaults and checks, and every preset's settings against the
trainers' defaults and recipes in loss-variants-spec.md (§1.11 TRL GRPOConfig, §2.6-§2.7 verl)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import grpo
from grpo.config import FIELD_NAMES, FIELDS, PRESETS, LossConfig

# TRL 1.16.0 GRPOConfig defaults (§1.11, §1.3, §1.5, §1.8): beta 0, epsilon 0.2 with epsilon_high
# None -> 0.2, group scaling with 1e-4, bias-corrected k3, max_completion_length 512, sequence
# means over all rows with clamp(L, 1), no clamps anywhere.
TRL_COMMON = {
    "beta": 0.0,
    "epsilon_low": 0.2,
    "epsilon_high": 0.2,
    "delta": None,
    "dual_clip": None,
    "advantage": "group",
    "advantage_epsilon": 1e-4,
    "kl_estimator": "k3",
    "kl_bias_correction": True,
    "max_completion_length": 512,
    "skip_empty_rows": False,
    "length_epsilon": 0.0,
    "log_ratio_clamp": None,
    "seq_log_ratio_clamp": None,
    "kl_log_ratio_clamp": None,
    "kl_clamp": None,
    "importance_sampling_level": "token",
}
# verl 0.9.1 (§2.3-§2.6): ActorConfig clip 0.2 / 0.2, clip_ratio_c 3, ±20 log-ratio clamp,
# low_var_kl with ±20 / ±10, 1e-6, agg_loss over rows with L > 0 and L + 1e-8, no bias correction.
VERL_COMMON = {
    "epsilon_low": 0.2,
    "epsilon_high": 0.2,
    "dual_clip": 3.0,
    "delta": None,
    "log_ratio_clamp": 20.0,
    "seq_log_ratio_clamp": None,
    "kl_estimator": "k3",
    "kl_log_ratio_clamp": 20.0,
    "kl_clamp": 10.0,
    "kl_bias_correction": False,
    "advantage": "group",
    "advantage_epsilon": 1e-6,
    "skip_empty_rows": True,
    "length_epsilon": 1e-8,
    "importance_sampling_level": "token",
}
EXPECTED: dict[str, dict[str, Any]] = {
    # the article's grpo_loss: epsilon 0.2, beta 0.01, k3, per-sequence token mean; notebook eps 1e-5
    "article": {
        "objective": "clip",
        "epsilon_low": 0.2,
        "epsilon_high": 0.2,
        "beta": 0.01,
        "kl_estimator": "k3",
        "kl_bias_correction": False,
        "aggregation": "seq-mean-token-mean",
        "advantage": "group",
        "advantage_epsilon": 1e-5,
        "dual_clip": None,
        "delta": None,
        "log_ratio_clamp": None,
        "kl_clamp": None,
        "skip_empty_rows": False,
        "length_epsilon": 0.0,
    },
    "trl-grpo": {**TRL_COMMON, "objective": "clip", "aggregation": "seq-mean-token-mean"},
    "trl-dapo": {**TRL_COMMON, "objective": "clip", "aggregation": "token-mean"},  # TRL's default loss_type
    "trl-dr_grpo": {**TRL_COMMON, "objective": "clip", "aggregation": "seq-mean-token-sum-norm"},
    "trl-gspo": {
        **TRL_COMMON,
        "objective": "clip",
        "aggregation": "seq-mean-token-mean",  # loss_type="grpo", as the GSPO paper and TRL's warning say
        "importance_sampling_level": "sequence",
        "epsilon_low": 3e-4,
        "epsilon_high": 4e-4,
    },
    "trl-cispo": {
        **TRL_COMMON,
        "objective": "cispo",
        "cispo_bounds": "absolute",
        "epsilon_high": 5.0,  # the docs' recommendation; None would cap at 0.2
        "aggregation": "token-mean",  # cispo shares dapo's normaliser
    },
    "trl-sapo": {
        **TRL_COMMON,
        "objective": "sapo",
        "sapo_temperature_pos": 1.0,
        "sapo_temperature_neg": 1.05,
        "aggregation": "seq-mean-token-mean",
    },
    "trl-vespo": {
        **TRL_COMMON,
        "objective": "vespo",
        "aggregation": "token-mean",  # vespo shares dapo's normaliser
        "vespo_k_pos": 2.0,
        "vespo_lambda_pos": 3.0,
        "vespo_k_neg": 3.0,
        "vespo_lambda_neg": 2.0,
    },
    # §2.7 GRPO: seq-mean-token-mean, use_kl_loss with low_var_kl at kl_loss_coef 0.001
    "verl-grpo": {**VERL_COMMON, "objective": "clip", "aggregation": "seq-mean-token-mean", "beta": 0.001},
    # §2.7 DAPO: token-mean, clip 0.2 / 0.28, no KL
    "verl-dapo": {**VERL_COMMON, "objective": "clip", "aggregation": "token-mean", "epsilon_high": 0.28, "beta": 0.0},
    # §2.3 gspo: no ±20 clamp and no dual clip, the sequence log-ratio clamped at 10; 3e-4 / 4e-4
    "verl-gspo": {
        **VERL_COMMON,
        "objective": "clip",
        "aggregation": "seq-mean-token-mean",
        "importance_sampling_level": "sequence",
        "epsilon_low": 3e-4,
        "epsilon_high": 4e-4,
        "dual_clip": None,
        "log_ratio_clamp": None,
        "seq_log_ratio_clamp": 10.0,
        "beta": 0.0,
    },
    # §2.3 verl's later losses, PolicyLossConfig defaults; no log-ratio clamp but dppo's ±20, dual clip only dppo's
    "verl-gmpo": {
        **VERL_COMMON,
        "objective": "geo_mean",
        "epsilon_low": 0.4,
        "epsilon_high": 0.4,
        "dual_clip": None,
        "log_ratio_clamp": None,
        "beta": 0.0,
    },
    "verl-clip_cov": {
        **VERL_COMMON,
        "objective": "clip_cov",
        "clip_cov_ratio": 0.0002,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
        "dual_clip": None,
        "log_ratio_clamp": None,
    },
    "verl-kl_cov": {
        **VERL_COMMON,
        "objective": "kl_cov",
        "kl_cov_ratio": 0.0002,
        "ppo_kl_coef": 0.1,
        "dual_clip": None,
        "log_ratio_clamp": None,
    },
    "verl-dppo_tv": {**VERL_COMMON, "objective": "dppo_tv", "dual_clip": 3.0, "log_ratio_clamp": 20.0},
    "verl-dppo_kl": {**VERL_COMMON, "objective": "dppo_kl", "dual_clip": 3.0, "log_ratio_clamp": 20.0},
}


def test_presets_are_the_ones_promised() -> None:
    assert list(PRESETS) == list(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_preset_settings_match_the_spec(name: str) -> None:
    config = LossConfig.from_preset(name)
    assert config.preset == name
    for field, value in EXPECTED[name].items():
        assert getattr(config, field) == value, field
    preset = PRESETS[name]
    assert preset.name == name and preset.doc and preset.source
    assert set(preset.settings) <= set(FIELD_NAMES)


def test_defaults_are_the_articles_grpo_loss() -> None:
    default = LossConfig()
    article = LossConfig.from_preset("article")
    assert dataclasses.replace(article, preset=None) == default
    assert default.dtype == "float32" and default.device == "auto"


def test_from_preset_overrides_and_replace() -> None:
    config = LossConfig.from_preset("verl-grpo", beta=0.0, epsilon_high=0.28)
    assert (config.beta, config.epsilon_high, config.dual_clip) == (0.0, 0.28, 3.0)
    assert config.replace(beta=0.5).beta == 0.5 and config.beta == 0.0
    assert LossConfig(**config.to_dict()) == config
    assert PRESETS["verl-grpo"].settings["beta"] == 0.001  # overriding never touches the preset


def test_unknown_preset_lists_the_valid_names() -> None:
    with pytest.raises(
        grpo.GrpoInputError, match=r"preset: expected one of article, trl-grpo, .*verl-dppo_kl, got 'trl'"
    ):
        LossConfig.from_preset("trl")


def test_unknown_override_names_the_field() -> None:
    with pytest.raises(grpo.GrpoInputError, match="clip_ratio: expected a LossConfig field") as err:
        LossConfig.from_preset("article", clip_ratio=0.2)
    assert err.value.field == "clip_ratio"


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("epsilon_low", -0.1, "epsilon_low: expected a number >= 0.0, got -0.1"),
        ("epsilon_high", -1, "epsilon_high: expected a number >= 0.0"),
        ("beta", -0.01, "beta: expected a number >= 0.0, got -0.01"),
        ("advantage_epsilon", -1e-6, "advantage_epsilon: expected a number >= 0.0"),
        ("dual_clip", 1.0, "dual_clip: expected a number > 1.0"),  # verl asserts c > 1
        ("delta", 0.5, "delta: expected a number > 1.0"),
        ("sapo_temperature_pos", 0.0, "sapo_temperature_pos: expected a number > 0.0"),
        ("kl_clamp", 0.0, "kl_clamp: expected a number > 0.0"),
        ("beta", float("nan"), "beta: expected a finite number"),
        ("beta", float("inf"), "beta: expected a finite number"),
        ("beta", "0.1", "beta: expected a finite number"),
        ("beta", True, "beta: expected a finite number"),
        ("max_completion_length", 0, "max_completion_length: expected a number >= 1"),
        ("max_completion_length", 1.5, "max_completion_length: expected an integer"),
        ("kl_bias_correction", 1, "kl_bias_correction: expected true or false"),
        ("epsilon_low", None, "epsilon_low: expected a value of type float"),
        *(
            (kind, "nope", f"{kind}: expected one of {', '.join(registry.names())}, got 'nope'")
            for kind, registry in grpo.REGISTRIES.items()
        ),
        ("importance_sampling_level", "row", "importance_sampling_level: expected one of token, sequence"),
        ("cispo_bounds", "both", "cispo_bounds: expected one of absolute, relative"),
        ("dtype", "float16", "dtype: expected one of float32, float64"),
        ("device", "tpu", "device: expected one of auto, cpu, cuda"),
    ],
)
def test_bad_values_name_the_field(field: str, value: Any, match: str) -> None:
    with pytest.raises(grpo.GrpoInputError, match=match.replace("(", r"\(").replace(")", r"\)")) as err:
        LossConfig(**{field: value})
    assert err.value.field == field
    with pytest.raises(grpo.GrpoInputError):
        LossConfig.from_preset("verl-grpo", **{field: value})


def test_every_field_is_documented_and_grouped() -> None:
    for f in dataclasses.fields(LossConfig):
        assert f.metadata.get("doc"), f.name
        assert f.metadata.get("group") in {
            "preset",
            "policy",
            "kl",
            "aggregation",
            "scaling",
            "advantage",
            "runtime",
        }, f.name
    assert tuple(f.name for f in dataclasses.fields(LossConfig)) == FIELD_NAMES
    for spec in FIELDS:
        if spec.choices is not None:
            assert getattr(LossConfig(), spec.name) in spec.choice_names()
    # every registry is offered by the LossConfig field of the same name
    assert {spec.name: spec.choices for spec in FIELDS if spec.name in grpo.REGISTRIES} == grpo.REGISTRIES


def test_config_is_frozen() -> None:
    config = LossConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.beta = 1.0  # type: ignore[misc]
