"""verl 0.9.1's rollout correction captured where verl computes it, and checked (the off-policy correction, verl side).

verl corrects for the sampler on the driver over the whole batch (``compute_rollout_correction_and_add_to_batch``:
IS weights, batch normalisation, rejection folded into the response mask), then its actor's ``ppo_loss`` sees
the weights and the mask after rejection only. Here verl's own driver function runs on a whole batch and
verl's own ``ppo_loss`` on its micro-batches with what the driver produced, inside ``grpo.capture.verl``; the
capture joins each loss call's rows to the driver's record, and check-run recomputes the weights and the
rejection from the sampler's log-probs: the loss and verl's weights must match, and an altered sampler
log-prob must fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_capture_verl import actor_config, call_ppo_loss, micro_batch

import grpo.capture
from grpo.capture.verl_driver import DRIVER_DIR
from grpo.check import IS_WEIGHT_CHECK, check_run
from grpo.runs import load_run, load_step, read_metadata

pytest.importorskip("verl")
ROOT = Path(__file__).resolve().parents[1]

CASES: dict[str, dict[str, Any]] = {
    "token_truncate": {"rollout_is": "token", "rollout_is_threshold": 2.0},
    # IcePop mask at sequence level, divided by the whole batch's mean (a batch-level fact a micro-batch lacks)
    "sequence_icepop_normalized": {
        "rollout_is": "sequence",
        "rollout_is_threshold": "1e-4_3.0",
        "rollout_is_batch_normalize": True,
    },
    "token_normalized": {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True},
    # three chained rejection criteria: tokens and rows leave the response mask on the driver
    "rejection_chain": {
        "rollout_is": "token",
        "rollout_is_threshold": 2.0,
        "rollout_rs": "token_k1,seq_mean_k3,seq_max_k2",
        "rollout_rs_threshold": "0.6_1.6,0.08,0.5",
    },
}


def whole_batch(seed: int, B: int = 8, P: int = 3, T: int = 7) -> dict[str, torch.Tensor]:
    """test_capture_verl's ragged micro-batch at the driver's size, with a sampler that disagrees with the trainer
    (0.15 nats of noise, one token far off)."""
    batch = micro_batch(seed, B, P, T)
    g = torch.Generator().manual_seed(1000 + seed)
    sampler = (batch["old"] + 0.15 * torch.randn(B, T, generator=g)).clamp(max=-1e-3)
    sampler[1, 0] -= 1.5  # one token the sampler scored far lower
    return batch | {"sampler": sampler}


def driver(whole: dict[str, torch.Tensor], case: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """verl's driver-side correction, called as ray_trainer calls it (the module's function, by name)."""
    from verl import DataProto
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import rollout_corr_helper

    batch = DataProto.from_dict(
        tensors={"old_log_probs": whole["old"], "rollout_log_probs": whole["sampler"], "response_mask": whole["mask"]}
    )
    batch, _ = rollout_corr_helper.compute_rollout_correction_and_add_to_batch(batch, RolloutCorrectionConfig(**case))
    weights = batch.batch.get("rollout_is_weights", None)
    return batch.batch["response_mask"], weights


def captured_run(run_dir: Path, case: dict[str, Any]) -> list[float]:
    """Two driver steps, each split into two micro-batches for verl's ppo_loss; the losses it returned."""
    config = actor_config(loss_agg_mode="token-mean", clip_ratio_high=0.28)
    returned = []
    with grpo.capture.verl(run_dir, micro_batches_per_step=2):
        for step in range(2):
            whole = whole_batch(step)
            after, weights = driver(whole, case)
            info = {"dp_size": 1, "batch_num_tokens": int(after.sum()), "global_batch_size": 8}
            for rows in (slice(0, 4), slice(4, 8)):
                mb = {k: (v[rows] if v.dim() else v) for k, v in whole.items()} | {"response_mask": after[rows]}
                if weights is not None:
                    mb["rollout_is_weights"] = weights[rows]
                returned.append(call_ppo_loss(config, mb, info)[0])
    return returned


@pytest.mark.parametrize("name", list(CASES))
def test_the_driver_correction_is_joined_and_checks(name: str, tmp_path: Path) -> None:
    returned = captured_run(tmp_path / "run", CASES[name])
    run = load_run(tmp_path / "run")
    assert run.info["unsupported"] == {}  # the weights were joined to the driver's record, not reported
    assert not (tmp_path / "run" / DRIVER_DIR).exists()  # the records are gone once the step files hold them
    for ref, loss in zip(run.steps, returned, strict=True):
        batch, config, info = load_step(ref.path)
        assert info["meta"]["loss"] == pytest.approx(loss, rel=1e-6, abs=1e-9)
        assert batch.sampling_per_token_logps is not None
        assert config.rollout_rs == CASES[name].get("rollout_rs")
    check = check_run(run)
    assert check.ok, [
        (m.step, m.micro, m.rel_error, {k: v.diff for k, v in m.metrics.items() if not v.ok}) for m in check.micro
    ]
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    weights = [m.metrics[IS_WEIGHT_CHECK] for m in check.micro]
    assert any(abs(w.trainer - 1.0) > 1e-3 for w in weights)  # the correction acted


def test_the_rejection_acted_and_the_normaliser_is_the_batchs(tmp_path: Path) -> None:
    """The chain rejects some tokens (the step files hold the mask before it; GRPO Lens takes them out again),
    and the normalised case carries the whole batch's mean, which no micro-batch's own mean equals."""
    captured_run(tmp_path / "rs", CASES["rejection_chain"])
    rejected = 0
    for ref in load_run(tmp_path / "rs").steps:
        bd = grpo.evaluate(*load_step(ref.path)[:2])
        rejected += int((bd.tokens.correction == grpo.corrections.REJECTED).sum())
    assert rejected > 0
    captured_run(tmp_path / "norm", CASES["token_normalized"])
    for ref in load_run(tmp_path / "norm").steps:
        _, config, _ = load_step(ref.path)
        own = grpo.evaluate(*load_step(ref.path)[:2], **{})  # the stored config: the batch's mean
        assert config.rollout_is_normalizer is not None and own is not None
        local = grpo.evaluate(load_step(ref.path)[0], config.replace(rollout_is_normalizer=None))
        assert float(local.loss) != pytest.approx(float(own.loss), rel=1e-6)


def test_an_altered_sampler_log_prob_fails_check_run(tmp_path: Path) -> None:
    captured_run(tmp_path / "run", CASES["token_truncate"])
    cli = [sys.executable, "-m", "grpo", "check-run", "--jobs", "1", str(tmp_path / "run")]
    assert subprocess.run(cli, cwd=ROOT, capture_output=True).returncode == 0
    path = sorted((tmp_path / "run" / "steps").iterdir())[0]
    metadata, tensors = read_metadata(path.read_bytes()), load_file(path)
    tensors["sampling_per_token_logps"][tensors["completion_mask"].bool()] -= 0.4
    save_file(tensors, path, metadata=metadata)
    assert subprocess.run(cli, cwd=ROOT, capture_output=True).returncode == 1


def test_without_the_driver_the_weights_are_reported(tmp_path: Path) -> None:
    """The actor alone (the driver not captured): the weights cannot be recomputed, and run.json says why."""
    whole = whole_batch(0)
    after, weights = driver(whole, CASES["token_truncate"])
    assert weights is not None
    config = actor_config(loss_agg_mode="token-mean")
    with grpo.capture.verl(tmp_path / "run") as cap:
        mb = whole | {"response_mask": after, "rollout_is_weights": weights}
        call_ppo_loss(config, mb, {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None})
        cap.next_step()
        # said as soon as the call is written, not only when the block ends (a Ray worker may be killed first)
        assert "driver" in load_run(tmp_path / "run").info["unsupported"]["rollout_is_weights"]
    assert "driver" in load_run(tmp_path / "run").info["unsupported"]["rollout_is_weights"]
