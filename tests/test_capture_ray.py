"""verl's Ray workers captured through the ``verl.plugins`` entry point, with a real local Ray.

Two Ray actors play verl's workers: each imports verl (which loads the entry point ``grpo_lens``), runs verl
0.9.1's own actor loss (``ppo_loss``, as tests/test_capture_verl.py calls it) on its own micro-batches, and
steps an optimiser after each step's two micro-batches. ``GRPO_LENS_CAPTURE_DIR`` reaches them only through
Ray's ``runtime_env`` (the driver does not have it, so inheritance cannot pass the test), as does ``RANK``
(verl's worker group sets it the same way). The run must hold each rank's files, numbered by each worker's
optimiser steps, and ``check-run`` must pass on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_check_parallel import same_check

from grpo.capture.verl_plugin import CAPTURE_DIR
from grpo.check import check_pool, check_run
from grpo.runs import load_run, load_step

ray = pytest.importorskip("ray")
pytest.importorskip("verl")
pytest.importorskip("PIL")

ROOT = Path(__file__).resolve().parent.parent
STEPS = 2
SEEDS = {rank: [[100 * rank + 10 * step + micro for micro in range(2)] for step in range(STEPS)] for rank in (0, 1)}


@ray.remote(num_cpus=0)
class Worker:
    """One of verl's actor workers: its loss calls and its optimiser."""

    def plugin_installed(self) -> bool:
        import verl  # noqa: F401 (verl loads its plugins as it is imported)

        return "grpo.capture.verl_plugin" in sys.modules and bool(os.environ.get(CAPTURE_DIR))

    def train(self, seeds: list[list[int]]) -> list[float]:
        import torch
        from test_capture_verl import actor_config, call_ppo_loss, micro_batch

        config = actor_config(loss_agg_mode="seq-mean-token-mean", use_kl_loss=True, kl_loss_coef=0.04)
        weight = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        info: dict[str, Any] = {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None}
        returned = []
        for step_seeds in seeds:
            for seed in step_seeds:
                returned.append(call_ppo_loss(config, micro_batch(seed), info)[0])
            optimizer.step()  # the worker's optimiser step ends its step
        return returned

    def train_given(self, steps: list[list[dict[str, Any]]], infos: list[dict[str, Any]]) -> list[float]:
        """verl's actor on the micro-batches the driver corrected (weights and the mask after rejection given),
        with each step's global batch info."""
        import torch
        from test_capture_verl import actor_config, call_ppo_loss

        config = actor_config(loss_agg_mode="token-mean", clip_ratio_high=0.28)
        weight = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        returned = []
        for micro_batches, info in zip(steps, infos, strict=True):
            returned += [call_ppo_loss(config, mb, info)[0] for mb in micro_batches]
            optimizer.step()
        return returned


@ray.remote(num_cpus=0)
class Driver:
    """verl's driver, a process of its own that lives through training: its rollout correction over the whole
    batch, recorded by the plugin (GRPO_LENS_CAPTURE_DIR in its environment) for the workers to join."""

    def correct(self, seed: int, case: dict[str, Any]) -> dict[str, Any]:
        import verl  # noqa: F401 (loads the plugin, which wraps the driver's correction)
        from test_capture_verl_offpolicy import driver, whole_batch

        whole = whole_batch(seed)
        after, weights = driver(whole, case)
        return whole | {"response_mask": after, "rollout_is_weights": weights}


# each verl import's process and its capture directory, by whether it was given one
Imports = dict[bool, tuple[subprocess.Popen[str], Path]]
PATHS = os.pathsep.join([str(ROOT), str(ROOT / "tests")])  # this checkout's grpo and the test helpers


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """One local Ray for the module (its start and stop take seconds): each test starts its own actors, with
    their own environment, writing into its own run directory."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(CAPTURE_DIR, raising=False)
        job = {"env_vars": {"PYTHONPATH": PATHS}}
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False, runtime_env=job)
        try:
            yield
        finally:
            ray.shutdown()


def test_ray_workers_capture_through_the_verl_plugin(local_ray: None, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    workers = {
        rank: Worker.options(  # type: ignore[attr-defined]
            runtime_env={"env_vars": {CAPTURE_DIR: str(run_dir), "RANK": str(rank), "PYTHONPATH": PATHS}}
        ).remote()
        for rank in SEEDS
    }
    assert all(ray.get([w.plugin_installed.remote() for w in workers.values()], timeout=300))
    returned = dict(zip(SEEDS, ray.get([workers[r].train.remote(SEEDS[r]) for r in SEEDS], timeout=600), strict=True))
    assert CAPTURE_DIR not in os.environ and not any(run_dir.glob("*.jsonl"))

    run = load_run(run_dir)
    assert run.info["source"] == "verl"
    # each rank's files, numbered by its own optimiser steps, in (step, rank, micro) order
    assert [(s.step, s.rank, s.micro) for s in run.steps] == [
        (step, rank, micro) for step in range(1, STEPS + 1) for rank in (0, 1) for micro in range(2)
    ]
    for ref in run.steps:
        loss = load_step(ref.path)[2]["meta"]["loss"]
        assert loss == pytest.approx(returned[ref.rank][2 * (ref.step - 1) + ref.micro], rel=1e-6, abs=1e-9)
    check = check_run(run)
    assert check.ok and len(check.micro) == 8
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    cli = subprocess.run([sys.executable, "-m", "grpo", "check-run", str(run_dir)], cwd=ROOT, capture_output=True)
    assert cli.returncode == 0, cli.stderr[-2000:]
    # check-run --ray: the same files spread over the cluster's workers (here the local Ray), the same result
    with check_pool(ray_address="auto") as pool:
        spread = check_run(run, pool=pool)
    same_check(spread, check)


def test_the_drivers_correction_reaches_the_workers_files(local_ray: None, tmp_path: Path) -> None:
    """verl's off-policy correction across processes: the driver's record (its plugin) joined by two workers'
    captures; check-run recomputes the weights and the rejection each rank's files carry."""
    run_dir = tmp_path / "run"
    env = {CAPTURE_DIR: str(run_dir), "PYTHONPATH": PATHS}
    case = {
        "rollout_is": "sequence",
        "rollout_is_threshold": "1e-4_3.0",
        "rollout_is_batch_normalize": True,
        "rollout_rs": "token_k1,seq_mean_k3",
        "rollout_rs_threshold": "0.6_1.6,0.08",
    }
    main = Driver.options(runtime_env={"env_vars": env}).remote()  # type: ignore[attr-defined]
    workers = [
        Worker.options(runtime_env={"env_vars": env | {"RANK": str(r)}}).remote()  # type: ignore[attr-defined]
        for r in (0, 1)
    ]
    # one driver call per step; each rank trains on its half of the rows, token-mean over both ranks' tokens
    steps = [ray.get(main.correct.remote(seed, case), timeout=300) for seed in range(STEPS)]
    infos = [{"dp_size": 2, "batch_num_tokens": int(w["response_mask"].sum()), "global_batch_size": 8} for w in steps]
    halves = {r: [[{k: (v[4 * r : 4 * r + 4] if v.dim() else v) for k, v in w.items()}] for w in steps] for r in (0, 1)}
    returned = ray.get([workers[r].train_given.remote(halves[r], infos) for r in (0, 1)], timeout=600)
    assert len(returned[0]) == len(returned[1]) == STEPS

    run = load_run(run_dir)
    assert not run.info.get("unsupported")  # every loss call's rows were found in the driver's records
    assert [(s.step, s.rank) for s in run.steps] == [(step, r) for step in range(1, STEPS + 1) for r in (0, 1)]
    for ref in run.steps:
        batch, config, _ = load_step(ref.path)
        assert batch.sampling_per_token_logps is not None and config.rollout_is_normalizer is not None
    check = check_run(run)
    assert check.ok, [(m.step, m.rank, m.rel_error, {k: v.diff for k, v in m.metrics.items()}) for m in check.micro]
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)


@pytest.fixture(scope="module")
def verl_imports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Imports]:
    """A process importing verl without and one with a capture directory, started together (each import takes
    seconds, on one core)."""
    script = (
        "import sys, verl\n"
        "from verl.trainer.ppo import core_algos\n"
        "print(core_algos.kl_penalty.__qualname__, 'grpo.capture.verl_plugin' in sys.modules)\n"
    )
    started = {}
    for capture in (False, True):
        capture_dir = tmp_path_factory.mktemp(f"capture-{capture}")
        env = {k: v for k, v in os.environ.items() if k != CAPTURE_DIR} | (
            {CAPTURE_DIR: str(capture_dir)} if capture else {}
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started[capture] = (proc, capture_dir)
    try:
        yield started
    finally:
        for proc, _ in started.values():
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("capture", [False, True])
def test_importing_verl_loads_the_plugin_which_acts_only_when_asked(capture: bool, verl_imports: Imports) -> None:
    proc, capture_dir = verl_imports[capture]
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    hooked = "VerlCapture.kl_hook" in stdout
    assert stdout.split()[-1] == "True"  # the entry point was loaded either way (pyproject.toml)
    assert hooked == capture
    assert list(capture_dir.iterdir()) == []  # no loss call: nothing written
