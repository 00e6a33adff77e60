"""Shared fixtures: the hand-derived batch (reference.HAND), random ragged batches, the hypothesis
profile, a guard that no test mutates the global registries or presets, the real TRL runs and the
dashboard's server for the browser tests (both once per session: each costs seconds of imports), and the
xdist groups and `alone` marks that `make test`'s parallel run follows."""

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


# `make test` runs the suite on two workers (pytest-xdist, --dist loadgroup), then the tests marked `alone`
# by themselves. Each test file is one group, so its module fixtures (a server, a browser) are built once,
# on one worker. Files sharing something are one group: Ray's local clusters (never two at once), the
# loopback ports 8300-8399 that test_browser_runs._port hands out, the TRL runs of `trl_runs`. Files that
# time what they test (a latency, a ratio of durations, a deadline) run alone, with nothing beside them.
SHARED = {
    "ray": ("test_capture_ray", "test_check_fork", "test_verdict"),
    "ports_8300": (
        "test_browser_runs",
        "test_browser_runs_kept",
        "test_browser_page35_rest",
        "test_browser_page_runs3",
        "test_browser_runs_imports",
        "test_browser_runs_verdict",
        "test_browser_sentences_last",
        "test_browser_timeline",
        "test_capture_trl",
    ),
}
GROUP_OF = {module: group for group, modules in SHARED.items() for module in modules}
ALONE = frozenset(
    {
        "test_advantages_speed",
        "test_benches",
        "test_hostile_costly",
        "test_hostile_edge",
        "test_hostile_lab",
        "test_hostile_members",
        "test_hostile_runs4",
        "test_lab_server",
        "test_lanes_cost",
        "test_nemo_rl_import_cases",
        "test_run_events",
    }
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with its xdist group (its file's, or the group its file shares) and `alone` where
    its file times something; runs before xdist reads the groups."""
    for item in items:
        module = item.path.stem
        if module in ALONE:
            item.add_marker(pytest.mark.alone)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(GROUP_OF.get(module, module)))


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
