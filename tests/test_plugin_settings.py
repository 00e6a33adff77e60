"""A plugin adds an objective with a setting of its own and a correction mode; both reach the library, the API,
the CLI and /api/v1/options with no other file edited.

The plugin is written under tmp_path and loaded through GRPO_LENS_PLUGINS in a fresh process, so no other
test sees the grown registries. The built-in variants' declarations are checked here too: each objective's
settings are LossConfig fields with the declared defaults, and each correction's declared level and action
are what its function computes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
from grpo.config import FIELDS, LossConfig
from grpo.corrections import ACTION_CODES, CORRECTIONS, KEPT
from grpo.objectives import OBJECTIVES

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

PLUGIN = '''
"""A scaled objective with its own setting, and a halving correction mode, from outside GRPO Lens."""
from grpo.corrections import CORRECTIONS, clamped_exp, truncated
from grpo.objectives import OBJECTIVES, ObjectiveTerms, regions
from grpo.registry import Setting

SCALE = Setting("toy_scale", 2.0, "The scaled objective's s: each token's term is s·r·A.", gt=0.0, le=100.0,
                trl="toy_scale")


@OBJECTIVES.register("scaled", label="Scaled", axis="scaled objective / |A|", settings=(SCALE,))
def scaled(ratio, logp, advantages, settings):
    """Scaled: toy_scale·r·A, the unclipped surrogate times the plugin's own setting."""
    surrogate = settings.toy_scale * ratio * advantages
    return ObjectiveTerms(surrogate, ratio.detach().expand_as(surrogate), regions(surrogate.detach()))


@CORRECTIONS.register("token_halve", label="token IS, halved", level="token", action="truncate")
def token_halve(log_ratio, mask, settings):
    """Per-token weight ½·exp(old - sampler), clamped to [rollout_is_min, rollout_is_max]."""
    return truncated(0.5 * clamped_exp(log_ratio, settings), settings)
'''

# reference.HAND with its padding as 0 (JSON has no NaN; the mask leaves it out): ratios r = [[1.5, 0.9],
# [0.5, 1.1, 4.0]], A = [+1, -1].
LN = math.log
BODY: dict[str, Any] = {
    "per_token_logps": [[LN(0.3), LN(0.45), 0.0], [LN(0.1), LN(0.55), LN(0.8)]],
    "old_per_token_logps": [[LN(0.2), LN(0.5), 0.0], [LN(0.2), LN(0.5), LN(0.2)]],
    "completion_mask": [[1, 1, 0], [1, 1, 1]],
    "advantages": [1.0, -1.0],
}
SCALED = {"objective": "scaled", "aggregation": "token-mean", "beta": 0.0, "dtype": "float64"}
# token mean of -s·r·A over the 5 counted tokens: Σ r·A = 1.5 + 0.9 - 0.5 - 1.1 - 4.0 = -3.2, so the loss is
# 3.2·s / 5: 1.28 at the declared default s = 2, 1.92 at s = 3.
AT_DEFAULT, AT_3 = 3.2 * 2 / 5, 3.2 * 3 / 5

REPORT = """
import json
from fastapi.testclient import TestClient
import grpo
import app.main
from grpo.corrections import CORRECTIONS
from test_plugin_settings import BODY, SCALED

api = TestClient(app.main.app)
options = api.get("/api/v1/options").json()
fields = {f["name"]: f for f in options["fields"]}
batch = grpo.Batch(**BODY)
def library(**fields):
    return float(grpo.evaluate(batch, grpo.LossConfig.resolve({**SCALED, **fields})).loss)
def api_loss(body, **fields):
    answer = api.post("/api/v1/loss", json={**body, "config": {**SCALED, **fields}})
    return answer.status_code, answer.json()
sampled = {**BODY, "sampling_per_token_logps": BODY["old_per_token_logps"]}
config = grpo.LossConfig.resolve({**SCALED, "toy_scale": 3.0})
print(json.dumps({
    "plugins": grpo.load_plugins(),
    "field": fields["toy_scale"],
    "correction_choices": fields["rollout_correction"]["choices"],
    "entry": {e["name"]: e for e in options["registries"]["objective"]}["scaled"],
    "corrections": {e["name"]: e for e in options["corrections"]},
    "library": [library(), library(toy_scale=3.0)],
    "halved": float(grpo.evaluate(grpo.Batch(**sampled), grpo.LossConfig.resolve(
        {**SCALED, "toy_scale": 3.0, "rollout_correction": "token_halve"})).loss),
    "config": [config.toy_scale, config.to_dict()["toy_scale"], grpo.LossConfig().toy_scale,
               config == grpo.LossConfig.resolve(SCALED), config.replace(beta=0.5).toy_scale],
    "api": api_loss(BODY, toy_scale=3.0)[1]["loss"],
    "api_default": api_loss(BODY)[1]["loss"],
    "api_halved": api_loss(sampled, toy_scale=3.0, rollout_correction="token_halve")[1]["loss"],
    "api_bad": [api_loss(BODY, toy_scale=v) for v in (0.0, 101.0, "x")],
    "level": CORRECTIONS.entry("token_halve").level,
}))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "scaled_plugin.py").write_text(PLUGIN, encoding="utf-8")
    path = os.pathsep.join([str(tmp_path), str(TESTS), str(ROOT)])
    return {**os.environ, "GRPO_LENS_PLUGINS": "scaled_plugin", "PYTHONPATH": path}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = _env(tmp_path_factory.mktemp("plugins"))
    done = subprocess.run(
        [sys.executable, "-c", REPORT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_setting_is_a_field_of_the_options(report: dict[str, Any]) -> None:
    assert report["plugins"] == ["scaled_plugin"]
    field = report["field"]
    assert field == {
        "name": "toy_scale",
        "doc": "The scaled objective's s: each token's term is s·r·A.",
        "group": "policy",
        "default": 2.0,
        "nullable": False,
        "type": "number",
        "gt": 0.0,
        "le": 100.0,
        "trl": "toy_scale",
    }
    assert report["entry"]["settings"] == ["toy_scale"] and report["entry"]["axis"] == "scaled objective / |A|"


def test_the_correction_mode_is_offered_with_its_level(report: dict[str, Any]) -> None:
    assert report["correction_choices"][-1] == "token_halve"
    assert report["corrections"]["token_halve"]["level"] == "token"
    assert report["corrections"]["token_halve"]["action"] == "truncate"
    assert report["level"] == "token"


@pytest.mark.numerical
def test_the_library_applies_the_setting(report: dict[str, Any]) -> None:
    # float64 sums of five terms: a few ulps of 1.92
    assert report["library"] == pytest.approx([AT_DEFAULT, AT_3], rel=1e-12)
    # the sampler equals the old policy, so exp(old - sampler) = 1 and every token's weight is ½
    assert report["halved"] == pytest.approx(AT_3 / 2, rel=1e-12)


def test_the_config_carries_the_setting(report: dict[str, Any]) -> None:
    # by name, in to_dict, with the declared default, in equality (3 differs from the default 2) and through replace
    assert report["config"] == [3.0, 3.0, 2.0, False, 3.0]


@pytest.mark.numerical
def test_the_api_applies_the_setting_and_the_mode(report: dict[str, Any]) -> None:
    assert report["api"] == report["library"][1]  # the same float64 computation, serialised
    assert report["api_default"] == report["library"][0]
    assert report["api_halved"] == report["halved"]


def test_the_api_refuses_a_setting_out_of_its_bounds_naming_it(report: dict[str, Any]) -> None:
    for status, answer in report["api_bad"]:
        assert status in (400, 422), answer
        assert "toy_scale" in json.dumps(answer)


@pytest.mark.numerical
def test_the_cli_sets_the_setting(tmp_path: Path, report: dict[str, Any]) -> None:
    env = _env(tmp_path)
    (tmp_path / "batch.json").write_text(json.dumps(BODY), encoding="utf-8")
    sets = [f"--set={k}={v}" for k, v in {**SCALED, "toy_scale": 3}.items()]
    cmd = [sys.executable, "-m", "grpo", "eval", str(tmp_path / "batch.json"), "--json", *sets]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["loss"] == pytest.approx(AT_3, rel=1e-12)
    bad = subprocess.run([*cmd, "--set=toy_scale=0"], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "toy_scale" in bad.stderr


def test_each_objective_setting_is_a_loss_config_field_with_its_declared_default() -> None:
    specs = {spec.name: spec for spec in FIELDS}
    declared = [s for entry in OBJECTIVES.entries() for s in entry.settings]
    assert len(declared) == 14
    for setting in declared:
        spec = specs[setting.name]
        assert getattr(LossConfig(), setting.name) == setting.default == spec.default
        want = (setting.doc, setting.bounds(), setting.trl, setting.verl)
        assert (spec.doc, spec.bounds, spec.trl, spec.verl) == want


@pytest.mark.parametrize("name", CORRECTIONS.names())
def test_each_correction_declares_the_level_and_action_it_computes(name: str) -> None:
    """A row of two tokens whose ratios fall outside tight bounds: the weight's width says the level (one per
    row or one per token) and its code what acting does."""
    config = LossConfig(rollout_correction=name, rollout_is_min=0.9, rollout_is_max=1.1)
    weights = CORRECTIONS.get(name)(torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), config)
    entry = CORRECTIONS.entry(name)
    if entry.level is None:
        assert weights.code == KEPT and entry.action is None
        return
    assert {1: "sequence", 2: "token"}[weights.weight.shape[-1]] == entry.level
    assert entry.action is not None and weights.code == ACTION_CODES[entry.action]


def test_a_plugins_setting_is_refused_where_no_plugin_declares_it() -> None:
    with pytest.raises(grpo.GrpoInputError) as err:
        LossConfig.resolve({"toy_scale": 3.0})
    assert err.value.field == "toy_scale"
