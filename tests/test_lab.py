"""grpo.lab: the policy, the tasks' rewards, the training loop, and what runs on it teach."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import pytest
import torch

import grpo
from grpo.lab import COMPARISONS, METRICS, TASKS, LabConfig, Trainer, get_task, init_policy, sample, train
from grpo.lab.policy import EOS, TOKEN_ID, VOCAB
from grpo.runs import RunWriter, load_run, load_step


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as in the server's lab workers: the tiny model's ops are faster without
    intra-op threads on a small machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ids(text: str) -> list[int]:
    return [TOKEN_ID[t] for t in text.split()]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_policy_is_small_and_seeded() -> None:
    a, b = init_policy(7), init_policy(7)
    assert sum(p.numel() for p in a.parameters()) <= 200_000
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    state = torch.random.get_rng_state()
    init_policy(8)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched


def test_sample_masks_up_to_the_first_eos() -> None:
    policy = init_policy(0)
    prompts = torch.tensor([ids("3")] * 32)
    rollout = sample(policy, prompts, 6, 1.0, torch.Generator().manual_seed(0))
    completion = rollout.tokens[:, 1:]
    for row, mask in zip(completion.tolist(), rollout.completion_mask.tolist(), strict=True):
        n = int(sum(mask))
        assert mask == [1.0] * n + [0.0] * (len(mask) - n)  # a prefix
        assert EOS not in row[: n - 1]  # no <eos> before the last counted token...
        assert row[n - 1] == EOS or n == len(row)  # ...which is the <eos>, unless the row hit the cap
        assert all(t == EOS for t in row[n:])  # padding
    again = sample(policy, prompts, 6, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(rollout.tokens, again.tokens)


@pytest.mark.parametrize(
    ("task", "prompt", "completion", "reward"),
    [
        ("count", "3", "x x x", 1.0),
        ("count", "3", "x . x 7 x", 1.0),  # only the x's count
        ("count", "3", "x", 0.5),  # two short: 1 - 2/4
        ("count", "1", "x x x x x x", 0.0),  # five too many: floored at 0
        ("add", "2 + 3 =", "5", 1.0),
        ("add", "2 + 3 =", "5 5", 0.5),  # the sum first, then more
        ("add", "2 + 3 =", "6", 0.0),
        ("length", "7 8", "5", 1.0),  # (7 + 8) mod 10 = 5, no token before it
        ("length", "7 8", ". . 5", 1.0 - 2 * 0.04),  # two tokens before the answer
        ("length", "7 8", "5 .", 0.0),  # the answer must come last
        ("length", "7 8", "", 0.0),
    ],
)
def test_rewards(task: str, prompt: str, completion: str, reward: float) -> None:
    got = get_task(task).reward(ids(prompt), ids(completion) if completion else [])
    assert got == pytest.approx(reward, abs=1e-12)


def test_rollout_rewards_read_the_completion_before_eos() -> None:
    task = get_task("count")
    tokens = torch.tensor([ids("2 x x <eos> x"), ids("2 x x x x")])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    assert task.rewards(tokens, mask).tolist() == [1.0, 0.5]  # padding after <eos> is not read


def test_unknown_task_lists_the_valid_names() -> None:
    with pytest.raises(grpo.GrpoInputError, match="count, add, length"):
        LabConfig(task="nope")
    with pytest.raises(grpo.GrpoInputError, match="num_iterations"):
        LabConfig(num_iterations=0)


def test_same_seed_and_config_give_the_same_metrics_exactly() -> None:
    config = LabConfig(steps=6, seed=3, num_iterations=2)
    first, second = train(config), train(config)
    assert first == second  # exact float equality, every metric of every step
    assert train(LabConfig(steps=6, seed=4, num_iterations=2)) != first


def test_every_step_logs_every_metric() -> None:
    for m in train(LabConfig(steps=2)):
        assert set(METRICS) <= set(m)
        assert all(math.isfinite(v) for v in m.values())
        assert m["loss"] == pytest.approx(m["policy_loss"] + m["kl_loss"], abs=1e-6)
        assert m["completions/min_length"] <= m["completions/mean_length"] <= m["completions/max_length"]


@pytest.mark.parametrize("preset", list(grpo.PRESETS))
def test_every_preset_trains(preset: str) -> None:
    config = LabConfig(steps=2, loss=grpo.LossConfig.from_preset(preset), num_iterations=2, learning_rate=1e-2)
    for m in train(config):
        assert all(math.isfinite(v) for v in m.values())


def test_overrides_reach_the_loss() -> None:
    loss = grpo.LossConfig.from_preset("article", beta=0.0)
    assert all(m["kl_loss"] == 0.0 for m in train(LabConfig(steps=3, loss=loss)))
    loss = grpo.LossConfig.from_preset("article", importance_sampling_level="sequence", objective="clip")
    assert len(train(LabConfig(steps=2, loss=loss))) == 2


def test_reused_samples_leave_ratio_one_and_clip() -> None:
    """num_iterations = 4: the rollout's first step is on-policy (nothing clips); later ones are not."""
    trainer = Trainer(LabConfig(num_iterations=4, learning_rate=1e-2))
    steps = [trainer.step() for _ in range(8)]
    assert [m["iteration"] for m in steps] == [1, 2, 3, 4, 1, 2, 3, 4]
    assert all(m["clip_ratio/region_mean"] == 0.0 for m in steps if m["iteration"] == 1)
    assert max(m["clip_ratio/region_mean"] for m in steps if m["iteration"] > 1) > 0.05


def test_saved_steps_reproduce_the_logged_loss(tmp_path: object) -> None:
    """Each step's file holds the batch the loss saw: evaluating it gives the logged loss, and the
    first step of a rollout has old = current log-probs (ratio 1)."""
    config = LabConfig(steps=3, num_iterations=2)
    writer = RunWriter(tmp_path, "lab", config.loss)  # type: ignore[arg-type]
    logged = train(config, writer)
    run = load_run(tmp_path)  # type: ignore[arg-type]
    assert run.step_numbers() == [1, 2, 3]
    for ref, metrics in zip(run.steps, logged, strict=True):
        batch, loss_config, info = load_step(ref.path)
        bd = grpo.evaluate(batch, loss_config)
        assert float(bd.loss) == pytest.approx(metrics["loss"], rel=1e-5, abs=1e-7)
        assert info["meta"]["metrics"]["reward"] == metrics["reward"]
        assert len(info["meta"]["tokens"]) == batch.shape[0]
        if metrics["iteration"] == 1:
            assert torch.equal(batch.logp, batch.old_per_token_logps)  # type: ignore[arg-type]


def test_default_task_learns() -> None:
    """Fixed seeds, 150 steps: the mean reward of the last 20 steps clearly beats the first 20."""
    rewards = [m["reward"] for m in train(LabConfig(steps=150, seed=0))]
    assert mean(rewards[-20:]) > mean(rewards[:20]) + 0.25


def test_length_task_grpo_grows_lengths_dr_grpo_far_less() -> None:
    """The canned comparison's claim: on the length task most answers stay wrong, and under GRPO's
    per-sequence mean a long wrong answer is penalised less per token, so lengths grow; under
    Dr. GRPO's aggregation (token sum over a constant; the one setting the two runs differ in: both keep
    group advantages) they grow far less, so GRPO ends longer.
    Two seeds, averaged: one run's length is noisy, the trend is not."""
    grpo_run, dr_run = COMPARISONS["length-bias"].runs
    assert (grpo_run.task, dr_run.task, grpo_run.steps) == ("length", "length", 100)

    def lengths(config: LabConfig) -> tuple[float, float]:
        """(mean length over the first 20 steps, over the last 30 of 100), averaged over seeds 0 and 1.
        (Measured here: GRPO 6.7 -> 10.3, Dr. GRPO's aggregation 6.4 -> 8.1.)"""
        first, last = [], []
        for seed in (0, 1):
            length = [m["completions/mean_length"] for m in train(dataclasses.replace(config, seed=seed))]
            first.append(mean(length[:20]))
            last.append(mean(length[-30:]))
        return mean(first), mean(last)

    grpo_first, grpo_last = lengths(grpo_run)
    dr_first, dr_last = lengths(dr_run)
    assert grpo_last > grpo_first + 1.5
    assert dr_last - dr_first < (grpo_last - grpo_first) - 1.0
    assert grpo_last > dr_last + 1.5


def test_tasks_are_documented() -> None:
    for task in TASKS.values():
        assert task.doc and task.teaches
        assert task.max_completion_length >= 1
        prompts = task.prompts(5, torch.Generator().manual_seed(0))
        assert prompts.shape == (5, task.prompt_length)
        assert all(0 <= t < len(VOCAB) for t in prompts.flatten().tolist())
