"""Shared fixtures: the hand-derived batch (reference.HAND), random ragged batches, the hypothesis
profile, a guard that no test mutates the global registries or presets, the real TRL runs and the
dashboard's server for the browser tests (both once per session: each costs seconds of imports)."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_fixtures import serve
from hypothesis import HealthCheck, settings
from reference import HAND, Inputs, random_inputs

import grpo

# Bounded by default so the library suite stays well under a minute on 2 cores; GRPO_HYPOTHESIS=deep
# runs twenty times as many examples when hunting for bugs.
settings.register_profile(
    "grpo", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("deep", settings.get_profile("grpo"), max_examples=1000)
settings.load_profile(os.environ.get("GRPO_HYPOTHESIS", "grpo"))


@pytest.fixture
def hand_batch() -> grpo.Batch:
    return grpo.Batch(**HAND)


@pytest.fixture(params=[0, 1, 2], ids=lambda s: f"seed{s}")
def inputs(request: pytest.FixtureRequest) -> Inputs:
    """Random ragged float64 batches of 6 rows, one fully masked, NaN in the padding."""
    return random_inputs(request.param)


def _snapshot() -> dict[str, Any]:
    registries = {kind: [(n, reg.get(n)) for n in reg.names()] for kind, reg in grpo.REGISTRIES.items()}
    presets = {name: (p.doc, p.source, copy.deepcopy(p.settings)) for name, p in grpo.PRESETS.items()}
    return {"registries": registries, "presets": presets}


@pytest.fixture(autouse=True)
def _globals_untouched() -> Iterator[None]:
    """Tests never mutate the registries or the presets: checked around every test."""
    before = _snapshot()
    yield
    assert _snapshot() == before, "a test mutated a global registry or preset"


LOSS_TYPES = ("grpo", "dapo", "dr_grpo")
# The dashboard server's per-token limit: low, so the large-batch path is exercised with a small batch.
FULL_TOKEN_LIMIT = 200


@pytest.fixture(scope="session")
def trl_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real TRL 1.16 GRPOTrainer runs on CPU (tests/trainers.py), captured with grpo.capture.trl, once per session."""
    pytest.importorskip("trl")
    from trainers import grpo_trainer

    import grpo.capture

    root = tmp_path_factory.mktemp("trl")
    out = {}
    for loss_type in LOSS_TYPES:
        trainer = grpo_trainer(root / f"out-{loss_type}", loss_type)
        with grpo.capture.trl(trainer, root / loss_type):
            trainer.train()
        out[loss_type] = root / loss_type
    return out


@pytest.fixture(scope="session")
def dashboard_server() -> Iterator[str]:
    """One uvicorn for the dashboard's browser tests (tests/test_browser.py, test_browser_explain.py and
    whoever asks), with a low per-token limit. Those tests send small bodies only, which never reach the
    large-request lane: no worker process (one would import torch for seconds, unused)."""
    with serve({"GRPO_LENS_FULL_TOKEN_LIMIT": str(FULL_TOKEN_LIMIT), "GRPO_LENS_PROCESS_WORKERS": "0"}) as url:
        yield url
