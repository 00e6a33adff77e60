"""grpo.step_schema: one schema for every writer's step files, derived from the batch-field table and the config.

- A batch field registered by a plugin (in a fresh process: no other test sees the changed table) reaches the
  step files of all four writers: TRL capture (its loss call's batch), verl capture (the policy loss's
  arguments, under an alias), the lab (a trainer's batch) and both importers (a dump's sample).
- The runs that could not be checked by their own tool now pass check-run: a lab run with an entropy bonus
  and a verl capture with ``entropy_coeff > 0`` write the entropies the loss reads.
- A step missing what the config's loss reads is refused when it is written, naming the field and the setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
from grpo import step_schema
from grpo.check import check_run
from grpo.lab import LabConfig, train
from grpo.runs import RunWriter, load_run, load_step

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

TOY_FIELD = '''
"""A toy per-token batch field, registered from outside GRPO Lens."""
import grpo

grpo.register_field(grpo.BatchField(
    "toy_scores", "token", "float", "Toy per-token scores in [0, 1].", aliases=("toy_score",), low=0.0, high=1.0,
))
'''

# Every writer, in the plugin's process: each gets the toy field where its trainer would hand it over, and
# the report says what each step file holds (the tensors read raw: the file, not a reader's view of it).
WRITERS = r"""
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

import grpo
from grpo.lab.train import LabConfig, Trainer
from grpo.runs import RunWriter, load_run, load_step
from test_importers import nemo_jsonl, nemo_train_data, slime_samples, slime_v2

root = Path(__import__("sys").argv[1])
B, T = 4, 5
g = torch.Generator().manual_seed(0)
mask = torch.ones(B, T)
mask[1, 3:] = 0
logp = (-torch.rand(B, T, generator=g) - 0.05) * mask
scores = torch.rand(B, T, generator=g) * mask

# TRL: the loss call's inputs, as a GRPOTrainer subclass would add the field to its generation batch
def write_trl():
    from grpo.capture.trl_hooks import _TrlHooks
    trainer = SimpleNamespace(
        loss_type="grpo", state=SimpleNamespace(global_step=0), _step=0, current_gradient_accumulation_steps=1,
        accelerator=SimpleNamespace(num_processes=1, process_index=0), args=SimpleNamespace(steps_per_generation=1),
        num_iterations=1, model=SimpleNamespace(training=True),
    )
    config = grpo.LossConfig.from_preset("trl-grpo")
    hooks = _TrlHooks(trainer, RunWriter(root / "trl", "trl", config, background=True), config)  # as grpo.capture.trl
    hooks.logps = (logp, torch.rand(B, T, generator=g) * mask)
    inputs = {
        "prompt_ids": torch.ones(B, 2, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "num_items_in_batch": mask.sum(),
        "toy_scores": scores,
    }
    hooks._write(inputs, torch.tensor(0.0), {})
    hooks.writer.close()
    return scores

# verl: the policy loss called with the field under its alias, as a custom actor's loss would hand it over
def write_verl():
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig, PolicyLossConfig
    from grpo.capture.verl_hooks import VerlCapture, verl_writer
    from grpo.runs import Sampling

    vanilla = get_policy_loss_fn("vanilla")
    def toy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights=None,
                 toy_score=None):
        return vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)

    actor = ActorConfig(strategy="fsdp", rollout_n=4, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4,
                        policy_loss=PolicyLossConfig(loss_mode="vanilla"))
    writer = verl_writer(root / "verl", None, Sampling())
    cap = VerlCapture(lambda: writer, None)
    cap.policy_hook(toy_loss)(
        old_log_prob=logp.clone(), log_prob=logp, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * mask,
        response_mask=mask.bool(), loss_agg_mode="token-mean", config=actor, toy_score=scores,
    )
    cap.flush()
    writer.close()
    return scores

# the lab: a trainer whose batch holds the field
def write_lab():
    class ToyTrainer(Trainer):
        def batch_fields(self, s, current):
            fields = super().batch_fields(s, current)
            return fields | {"toy_scores": 0.5 * fields["completion_mask"]}

    lab = LabConfig(steps=1, prompts_per_step=2, group_size=2, hidden=8)
    toy = ToyTrainer(lab, RunWriter(root / "lab", "lab", lab.loss))
    toy.step()
    return 0.5 * toy._sampled.rollout.completion_mask

# NeMo RL: each line holds the field per token, aligned with token_ids as every per-token value (the loss reads [1:])
def write_nemo_rl():
    log_data = nemo_train_data(1)
    S = len(log_data["token_ids"][0])
    nemo_scores = torch.rand(len(log_data["rewards"]), S, generator=g)
    log_data["toy_scores"] = nemo_scores.tolist()
    (root / "nemo").mkdir()
    (root / "nemo" / "train_data_step1.jsonl").write_text(nemo_jsonl(log_data))
    from grpo.importers.nemo_rl import import_nemo_rl
    import_nemo_rl(root / "nemo", root / "nemo-rl")
    return nemo_scores[:, 1:]

# slime: each sample holds the field over its response tokens, under the alias
def write_slime():
    samples = slime_samples(0)
    for s in samples:
        s["toy_score"] = torch.rand(s["response_lengths"], generator=g)
    (root / "slime-dump").mkdir()
    torch.save(slime_v2(0, samples), root / "slime-dump" / "0.pt")
    from grpo.importers.slime import import_slime
    import_slime(root / "slime-dump", root / "slime")
    return torch.nn.utils.rnn.pad_sequence([s["toy_score"] for s in samples], batch_first=True)


report = {}
for name, write in [("trl", write_trl), ("verl", write_verl), ("lab", write_lab), ("nemo-rl", write_nemo_rl),
                    ("slime", write_slime)]:
    try:  # each writer on its own: one that fails is said, the others still report
        want = write()
    except Exception as exc:
        report[name] = {"error": f"{type(exc).__name__}: {exc}"[:600], "names": []}
        continue
    (ref,) = load_run(root / name).steps
    tensors = load_file(ref.path)
    got = tensors.get("toy_scores")
    read = load_step(ref.path)[0].extra.get("toy_scores")  # the reader hands it to the Batch
    report[name] = {
        "names": sorted(tensors),
        "equal": got is not None and got.shape == want.shape and torch.equal(got.float(), want.float()),
        "read": read is not None and read.shape == got.shape,
    }
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def toy_steps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("verl")
    root = tmp_path_factory.mktemp("toy_field")
    (root / "plugins").mkdir()
    (root / "plugins" / "toy_field.py").write_text(TOY_FIELD, encoding="utf-8")
    path = os.pathsep.join([str(root / "plugins"), str(TESTS), str(ROOT)])
    env = {**os.environ, "GRPO_LENS_PLUGINS": "toy_field", "PYTHONPATH": path}
    (root / "runs").mkdir()
    cmd = [sys.executable, "-c", WRITERS, str(root / "runs")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("writer", ["trl", "verl", "lab", "nemo-rl", "slime"])
def test_a_plugins_batch_field_is_in_every_writers_step_files(toy_steps: dict[str, Any], writer: str) -> None:
    """Registered by a plugin, the field is kept by every writer under its table name (verl's and slime's come
    under the alias), with the values the trainer had (NeMo RL's shifted by one, as its loss reads them)."""
    step = toy_steps[writer]
    assert "error" not in step, step["error"]
    assert "toy_scores" in step["names"] and "toy_score" not in step["names"], step["names"]
    assert step["equal"] and step["read"]
    # what is not a step's (TRL's prompt_ids and num_items_in_batch) stays out
    assert not {"prompt_ids", "num_items_in_batch"} & set(step["names"])


def test_a_lab_run_with_an_entropy_bonus_passes_check_run(tmp_path: Path) -> None:
    """entropy_coef > 0: the lab trains with the bonus, and its step files hold the entropies it read, so
    check-run recomputes the very loss it logged (the same float32 tensors: no rounding apart)."""
    config = LabConfig(steps=2, prompts_per_step=2, group_size=4, hidden=16, loss=grpo.LossConfig(entropy_coef=0.01))
    train(config, RunWriter(tmp_path / "run", "lab", config.loss))
    run = load_run(tmp_path / "run")
    batch, loss_config, _ = load_step(run.steps[0].path)
    assert batch.entropies is not None and loss_config.entropy_coef == 0.01
    check = check_run(run)
    assert check.ok and len(check.micro) == 2
    assert all(m.rel_error is not None and m.rel_error <= 1e-6 for m in check.micro), [m.rel_error for m in check.micro]


def test_the_lab_refuses_a_setting_its_rollouts_cannot_feed() -> None:
    """The lab samples from its own policy: no sampler's log-probs, so a rollout correction is refused when the
    run is configured (naming the setting and the field it reads), not at its first step file."""
    with pytest.raises(grpo.GrpoInputError, match=r"^rollout_correction: .*reads sampling_per_token_logps"):
        LabConfig(loss=grpo.LossConfig(rollout_correction="token_truncate"))
    LabConfig(loss=grpo.LossConfig(entropy_coef=0.01, top_entropy_quantile=0.5))  # the lab has the entropies


def test_a_verl_capture_with_entropy_coeff_passes_check_run(tmp_path: Path) -> None:
    """verl's ppo_loss with entropies in its model output and entropy_coeff 0.01: the capture writes the
    entropies agg_loss read for the bonus, and check-run reproduces what ppo_loss returned, bonus included."""
    pytest.importorskip("verl")
    from test_capture_verl import actor_config, micro_batch

    config = actor_config(loss_agg_mode="seq-mean-token-mean", entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.04)
    returned = []
    with grpo.capture.verl(tmp_path / "run", micro_batches_per_step=2):
        for seed in range(4):
            mb = micro_batch(seed)
            entropies = torch.rand(mb["mask"].shape, generator=torch.Generator().manual_seed(seed)) * 2
            returned.append(ppo_loss_with_entropy(config, mb, entropies))
    run = load_run(tmp_path / "run")
    assert len(run.steps) == 4
    for ref, loss in zip(run.steps, returned, strict=True):
        batch, loss_config, info = load_step(ref.path)
        assert batch.entropies is not None and loss_config.entropy_coef == 0.01
        assert info["meta"]["loss"] == pytest.approx(loss, rel=1e-6, abs=1e-9)
    check = check_run(run)
    assert check.ok, [(m.step, m.micro, m.rel_error) for m in check.micro]
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)


def ppo_loss_with_entropy(config: Any, mb: dict[str, torch.Tensor], entropies: torch.Tensor) -> float:
    """verl's actor loss on one micro-batch, the model output (log-probs and entropies) in its no-padding layout."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    B, T = mb["mask"].shape
    P = int(mb["prompt_length"])
    flat: dict[str, list[torch.Tensor]] = {"log_probs": [], "entropy": []}
    for i in range(B):  # each sequence is prompt + response; position t scores token t + 1
        n = int(mb["lengths"][i])
        for key, values in (("log_probs", mb["logp"]), ("entropy", entropies)):
            segment = torch.zeros(P + n)
            segment[P - 1 : P - 1 + n] = values[i, :n]
            flat[key].append(segment)
    data = TensorDict(
        {
            "prompts": torch.ones(B, P, dtype=torch.long),
            "responses": torch.ones(B, T, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, P), mb["mask"]], 1).long(),
            "response_mask": mb["mask"],
            "old_log_probs": mb["old"],
            "advantages": mb["advantages"],
            "ref_log_prob": mb["ref"],
        },
        batch_size=[B],
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    loss, _ = ppo_loss(config, {key: torch.cat(parts) for key, parts in flat.items()}, data)
    return float(loss)


def step(seed: int = 0, B: int = 4, T: int = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) - 0.05
    return {
        "per_token_logps": old + 0.05 * torch.randn(B, T, generator=g).clamp(max=0.04),
        "old_per_token_logps": old,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
    }


@pytest.mark.parametrize(
    ("settings", "field", "because"),
    [
        ({"entropy_coef": 0.01}, "entropies", "entropy_coef=0.01 reads it"),
        ({"top_entropy_quantile": 0.2}, "entropies", "top_entropy_quantile=0.2 reads it"),
        ({"rollout_correction": "token_truncate"}, "sampling_per_token_logps", "rollout_correction=token_truncate"),
        ({"rollout_bypass": True}, "sampling_per_token_logps", "rollout_bypass=True reads it"),
    ],
)
def test_a_step_missing_what_the_loss_reads_is_refused_naming_it(
    tmp_path: Path, settings: dict[str, Any], field: str, because: str
) -> None:
    """Written through RunWriter (every writer's path), a step without the field its config's loss reads is
    refused, naming the field and the setting; nothing is written. With the field, the same step is written."""
    config = grpo.LossConfig(**settings)
    writer = RunWriter(tmp_path / "run", "lab", config)
    with pytest.raises(grpo.GrpoInputError, match=f"^{field}: .*required because {because}") as refused:
        writer.write_step(1, 0, step(), {})
    assert refused.value.field == field
    assert list((tmp_path / "run" / "steps").iterdir()) == []
    (missing,) = step_schema.missing_for(config, step())
    assert missing.startswith(f"{field}: required because {because}")
    given = step()
    given[field] = given["old_per_token_logps"].abs() if field == "entropies" else given["old_per_token_logps"] - 0.01
    path = writer.write_step(1, 0, given, {})
    assert path is not None and getattr(load_step(path)[0], field) is not None


def test_the_reference_log_probs_are_a_stand_in_not_a_requirement(tmp_path: Path) -> None:
    """beta > 0 reads the reference log-probs, but the loss stands in for them (the current policy: KL 0), as an
    import of a dump without them must: the step is written, and stand_ins says what the loss took instead."""
    config = grpo.LossConfig(beta=0.04)
    assert step_schema.missing_for(config, step()) == []
    (why,) = step_schema.stand_ins(config, step()).values()
    assert why.startswith("beta=0.04 reads it (the KL penalty); absent, the loss takes the current policy")
    assert step_schema.stand_ins(config, step() | {"ref_per_token_logps": step()["old_per_token_logps"]}) == {}
    assert RunWriter(tmp_path / "run", "nemo-rl", config).write_step(1, 0, step(), {}) is not None


def test_the_advantages_or_what_they_come_from_are_required() -> None:
    """The loss reads the advantages, or the rewards (and what the estimator needs of them: ReMax's greedy
    baselines) to compute them from."""
    logps = {"per_token_logps": step()["per_token_logps"]}
    with pytest.raises(grpo.GrpoInputError, match=r"^advantages: .*or rewards, token_level_rewards"):
        step_schema.step_tensors(logps, grpo.LossConfig())
    rewards = logps | {"rewards": torch.tensor([1.0, 0.0, 1.0, 0.0])}
    assert set(step_schema.step_tensors(rewards, grpo.LossConfig())) == {"per_token_logps", "rewards"}
    with pytest.raises(grpo.GrpoInputError, match=r"^reward_baselines: .*advantage=remax reads it"):
        step_schema.step_tensors(rewards, grpo.LossConfig(advantage="remax"))


def test_aliases_are_renamed_and_a_field_given_twice_is_refused() -> None:
    """verl's names are the table's aliases: kept under the table's names; one field under both is refused."""
    given = {"log_prob": step()["per_token_logps"], "advantages": step()["advantages"], "prompt_ids": torch.ones(4)}
    assert set(step_schema.step_tensors(given, grpo.LossConfig())) == {"per_token_logps", "advantages"}
    with pytest.raises(grpo.GrpoInputError, match=r"^log_prob: expected one of per_token_logps or its aliases"):
        step_schema.step_tensors(step() | given, grpo.LossConfig())
