"""bench/golden.py, the corpus a restructuring is compared against bit for bit: its cases cover every preset,
objective, advantage estimator, rollout correction and rejection option, and a record is deterministic (the same
cases recorded twice in one process are equal, so a difference after a change is the change's)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import grpo
from grpo.corrections import CORRECTIONS, RS_CRITERIA

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def golden() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_golden", ROOT / "bench" / "golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_cases_cover_every_variant(golden: ModuleType) -> None:
    cases = golden.cases()
    names = [case.name for case in cases]
    assert len(names) == len(set(names))  # a name says which case differs
    assert {case.preset for case in cases} == set(grpo.PRESETS)
    assert {case.overrides.get("objective") for case in cases} >= set(grpo.OBJECTIVES.names())
    assert {case.overrides.get("advantage") for case in cases} >= set(grpo.ADVANTAGES.names())
    assert {case.overrides.get("rollout_correction") for case in cases} >= set(CORRECTIONS.names())
    assert {case.overrides.get("rollout_rs") for case in cases} >= set(RS_CRITERIA)
    assert {case.overrides.get("kl_estimator") for case in cases} >= set(grpo.KL_ESTIMATORS.names())
    assert {case.overrides.get("aggregation") for case in cases} >= set(grpo.AGGREGATIONS.names())
    kinds = [case.request for case in cases]
    assert any(isinstance(r.get("advantages", [None])[0], list) for r in kinds)  # per-token advantages
    assert any("token_level_rewards" in r for r in kinds)
    assert any("sampling_per_token_logps" in r for r in kinds)


def test_a_record_equals_itself(golden: ModuleType) -> None:
    """One case of each kind (the first of every name prefix), recorded twice: equal, and each records what it
    says (a breakdown's tensors as bytes, the answer's sentences, compute_loss), or the error it raises."""
    cases = golden.cases()
    firsts = list({case.name.split("/")[0]: case for case in reversed(cases)}.values())
    firsts += [case for case in cases if case.name in ("mismatch-one-token/own", "setting/extreme/bias")]
    first, second = golden.record(firsts), golden.record(firsts)
    assert first == second
    assert not list(golden.differences(first, second))
    recorded = [r for r in first.values() if "error" not in r]
    assert len(recorded) >= len(firsts) - 1
    for r in recorded:
        tokens = r["breakdown"]["tokens"]
        assert set(tokens["grad"]) == {"dtype", "shape", "bytes"} and tokens["grad"]["bytes"]
        assert r["breakdown"]["loss"] == r["compute_loss"]["loss"]  # evaluate's loss is compute_loss's, bit for bit
        assert '"explanation":[' in r["answer"]


def test_differences_name_the_path(golden: ModuleType) -> None:
    base = {"case": {"loss": golden.encode(0.5), "answer": "abc"}}
    now = {"case": {"loss": golden.encode(0.25), "answer": "abd"}}
    found = list(golden.differences(base, now))
    assert len(found) == 2
    assert found[0].startswith("/case/answer at 2:")
    assert found[1] == "/case/loss/float at 19: ...'0x1.0000000000000p-1' != ...'0x1.0000000000000p-2'"
