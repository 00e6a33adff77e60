"""Benchmarks of grpo.evaluate (forward, backward, the whole breakdown) against the losses it reproduces.

All on the same ragged 256 x 4096 batch in this process; each pair is timed taking turns (median of
``--repeats``), so machine load hits both alike: the figures are the ratios, never the milliseconds.

- ``article``: grpo.evaluate against the bare article loss (target <= 1.0x).
- ``families``: for each objective family, the breakdown against the trainer's own loss + backward
  with the same settings: TRL 1.16's ``GRPOTrainer._compute_loss`` on a real trainer (a tiny model whose
  log-prob call returns the batch's log-probs as the variable, as tests/test_parity_offpolicy_trl.py does) for
  every loss_type, the entropy mask and the entropy bonus; verl 0.9.1's registered policy-loss function
  (``core_algos.get_policy_loss_fn``, called as tests/test_parity_verl_losses.py does) for every registered
  loss_mode, plus its actor's KL loss and entropy bonus added as ``losses.ppo_loss`` adds them. Each line also
  gives how far the two losses are apart (float32), so a timing never compares different computations
  (target: none above 1.5x).
- ``offpolicy``: with the sampler's log-probs, the breakdown with TRL's ``sequence_mask`` and with
  verl's ``rollout_is="sequence"``, threshold ``"1e-4_3.0"``, against verl's vanilla loss with that correction
  computed inside the timing (``rollout_corr_helper.compute_rollout_correction_and_rejection_mask``, as
  tests/test_parity_offpolicy_verl.py calls it) (target <= 1.0x).

    .venv/bin/python bench/core.py [--only article,families,offpolicy] [--rows 256] [--tokens 4096]
                                   [--repeats 15] [--preset article] [--clock wall|cpu] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/trainers.py: the tiny TRL trainer built from a config
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import grpo  # noqa: E402
from grpo._allocator import keep_freed_memory  # noqa: E402

Tensors = dict[str, torch.Tensor]


def ragged_batch(B: int, T: int, seed: int = 0) -> Tensors:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 8, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # right padding
    old = -torch.rand(B, T, generator=g) * 4 - 0.01
    logp = (old + 0.3 * torch.randn(B, T, generator=g)).clamp(max=0)
    ref = (old + 0.1 * torch.randn(B, T, generator=g)).clamp(max=0)
    adv = torch.randn(B, generator=g)
    # the extra inputs some families read: per-token entropies; the sampler's log-probs, off the trainer's old
    # ones by bf16-like noise (a sequence's summed log-ratio spreads by ~0.02·sqrt(L): some rows pass log 3)
    entropies = torch.rand(B, T, generator=g) * 3 * mask
    sampler = (old + 0.02 * torch.randn(B, T, generator=g)).clamp(max=0)
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "adv": adv, "entropies": entropies, "sampler": sampler}


def as_batch(t: Tensors, *extra: str, ref: bool = True) -> grpo.Batch:
    """``ragged_batch``'s tensors as a grpo.Batch (with its checks); ``extra``: entropies, sampler; ``ref``: with the
    reference log-probs (a trainer without a KL term computes none, and its capture records none)."""
    return grpo.Batch(
        per_token_logps=t["logp"],
        old_per_token_logps=t["old"],
        ref_per_token_logps=t["ref"] if ref else None,
        completion_mask=t["mask"],
        advantages=t["adv"],
        entropies=t["entropies"] if "entropies" in extra else None,
        sampling_per_token_logps=t["sampler"] if "sampler" in extra else None,
    )


def article_kl(pi_logprob: torch.Tensor, pi_ref_logprob: torch.Tensor) -> torch.Tensor:
    """The article's grpo_kl, as written."""
    return pi_ref_logprob.exp() / pi_logprob.exp() - (pi_ref_logprob - pi_logprob) - 1


def article_loss(
    pi: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The article's grpo_loss, line for line, with a ragged mask and per-row lengths in place of
    its input_len slice and its one shared len_oi."""
    epsilon, beta = 0.2, 0.01
    bs = pi.shape[0]
    len_oi = mask.sum(-1).clamp(min=1)
    ratio = torch.exp(pi - old)
    ratio_clip = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
    advantage = adv.unsqueeze(dim=1)
    policy_gradient = torch.minimum(ratio * advantage, ratio_clip * advantage)
    kl = article_kl(pi, ref)
    loss = (policy_gradient - beta * kl) * mask
    loss = (-1 / bs) * (1 / len_oi.unsqueeze(dim=1)) * loss
    return loss.sum()


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
clock = time.perf_counter
"""What the timings read: wall time, or (--clock cpu) the CPU time of this thread, which with torch on one thread
is every operation's: on a machine shared with other work it moves far less with the load than the wall time."""


def time_interleaved(
    fns: list[Callable[[], object]], repeats: int, timer: Callable[[], float] | None = None
) -> list[list[float]]:
    """Times each function ``repeats`` times, taking turns, so machine noise hits all alike (``timer``: the
    clock read, by default the one ``--clock`` chose)."""
    read = timer or clock
    for fn in fns:
        fn()  # warm-up
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for times, fn in zip(out, fns, strict=True):
            start = read()
            fn()
            times.append(read() - start)
    return out


# --- article -------------------------------------------------------------------------------------
def bench_article(t: Tensors, repeats: int, preset: str) -> None:
    batch = as_batch(t)
    config = grpo.LossConfig.from_preset(preset)

    def bare() -> None:
        pi = t["logp"].clone().requires_grad_(True)
        article_loss(pi, t["old"], t["ref"], t["adv"], t["mask"]).backward()

    def full() -> None:
        grpo.evaluate(batch, config)

    def full_with_checks() -> None:
        grpo.evaluate(as_batch(t), config)

    bare_t, full_t, checked_t = (
        statistics.median(times) for times in time_interleaved([bare, full, full_with_checks], repeats)
    )
    print(f"-- article: grpo.evaluate vs the bare article loss, preset {preset}")
    print(f"bare article loss, forward + backward : {bare_t * 1e3:8.2f} ms (median of {repeats})")
    print(f"grpo.evaluate, whole breakdown        : {full_t * 1e3:8.2f} ms")
    print(f"grpo.Batch checks + grpo.evaluate     : {checked_t * 1e3:8.2f} ms")
    print(f"ratio evaluate / bare                 : {full_t / bare_t:8.2f}  (target <= 1.0)")


# --- the trainers' own losses ---------------------------------------------------------------------
@dataclass
class Family:
    """One objective family: the breakdown's config and batch, and the trainer's loss + backward."""

    name: str
    config: grpo.LossConfig
    batch: grpo.Batch
    trainer_loss: Callable[[], torch.Tensor]
    """The trainer's loss on the batch, after its backward (timed as it is)."""


class TrlTrainers:
    """Real TRL 1.16 GRPOTrainers (tests/trainers.py's tiny model, one saved copy) whose log-prob call
    returns the batch's log-probs as the variable: ``_compute_loss`` is TRL's own on the batch."""

    def __init__(self, root: Path) -> None:
        from trainers import save_model

        self.root = root
        save_model(root / "model")
        self.count = 0

    def family(self, name: str, t: Tensors, settings: dict[str, Any], extra: tuple[str, ...] = ()) -> Family:
        from trainers import grpo_trainer

        from grpo.trainer_config import map_trl

        B, T = t["mask"].shape
        self.count += 1
        settings = {"beta": 0.0, "max_completion_length": T, **settings}  # GRPOConfig's beta (tests' is 0.04)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = grpo_trainer(
                self.root / f"out{self.count}",
                settings.pop("loss_type"),
                model_dir=self.root / "model",
                gradient_accumulation_steps=1,
                num_iterations=1,
                **settings,
            )
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1  # what the training loop sets before each step
        inputs = {
            "prompt_ids": torch.zeros(B, 0, dtype=torch.long),
            "prompt_mask": torch.zeros(B, 0, dtype=torch.long),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": t["mask"],
            "advantages": t["adv"],
            "old_per_token_logps": t["old"],
            "num_items_in_batch": t["mask"].sum(),
        }
        if trainer.beta != 0.0:
            inputs["ref_per_token_logps"] = t["ref"]

        def loss() -> torch.Tensor:
            leaf = t["logp"].clone().requires_grad_(True)  # the model's output: the variable
            trainer._get_per_token_logps_and_entropies = lambda *a, **k: (leaf, t["entropies"], None)
            trainer._metrics["train"].clear()
            out: torch.Tensor = trainer._compute_loss(trainer.model, inputs)
            out.backward()
            return out.detach()

        mapping = map_trl(trainer.args)
        assert not mapping.unsupported, mapping.unsupported
        config = mapping.config
        return Family(f"trl {name}", config, as_batch(t, *extra, ref=config.beta != 0), loss)


def verl_actor_config(loss_mode: str, policy: dict[str, Any] | None = None, **fields: Any) -> Any:
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=4,
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=4,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode, **(policy or {})),
        **fields,
    )


def verl_actor_loss(config: Any, t: Tensors, leaf: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """verl 0.9.1's actor loss on padded tensors: the registered policy loss (with ``rollout_is_weights``), then
    the entropy bonus and the KL loss as ``verl.workers.utils.losses.ppo_loss`` adds them (its no-padding layout
    conversion left out)."""
    from verl.trainer.ppo import core_algos

    mask = t["mask"]
    agg = config.loss_agg_mode
    loss, _ = core_algos.get_policy_loss_fn(config.policy_loss.loss_mode)(
        old_log_prob=t["old"],
        log_prob=leaf,
        advantages=t["adv"][:, None] * mask,
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=weights,
    )
    if config.entropy_coeff:
        entropy = core_algos.agg_loss(
            loss_mat=t["entropies"], loss_mask=mask, loss_agg_mode=agg, **config.global_batch_info
        )
        loss = loss - config.entropy_coeff * entropy
    if config.use_kl_loss:
        kld = core_algos.kl_penalty(logprob=leaf, ref_logprob=t["ref"], kl_penalty=config.kl_loss_type)
        kl = core_algos.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=agg, **config.global_batch_info)
        loss = loss + kl * config.kl_loss_coef
    return loss


def verl_family(name: str, t: Tensors, config: Any, extra: tuple[str, ...] = ()) -> Family:
    from grpo.trainer_config import map_verl

    mapping = map_verl(config)
    assert not mapping.unsupported, mapping.unsupported

    def loss() -> torch.Tensor:
        leaf = t["logp"].clone().requires_grad_(True)
        torch.manual_seed(0)  # clip_cov draws its tokens with torch.randperm; GRPO Lens with clip_cov_seed 0
        out = verl_actor_loss(config, t, leaf)
        out.backward()
        return out.detach()

    lens_config = mapping.config.replace(clip_cov_seed=0)
    return Family(f"verl {name}", lens_config, as_batch(t, *extra, ref=lens_config.beta != 0), loss)


# (name, GRPOConfig settings, the batch's extra fields): every TRL 1.16 loss_type, the sequence level (GSPO), the
# KL, the entropy mask and the entropy bonus
TRL_FAMILIES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("grpo", {"loss_type": "grpo"}, ()),
    ("bnpo", {"loss_type": "bnpo"}, ()),
    ("dr_grpo", {"loss_type": "dr_grpo"}, ()),
    ("dapo", {"loss_type": "dapo"}, ()),
    ("luspo", {"loss_type": "luspo"}, ()),
    ("cispo", {"loss_type": "cispo", "epsilon_high": 5.0}, ()),
    ("sapo", {"loss_type": "sapo"}, ()),
    ("vespo", {"loss_type": "vespo"}, ()),
    ("gspo", {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4}, ()),
    ("grpo + kl beta 0.04", {"loss_type": "grpo", "beta": 0.04}, ()),
    ("dapo + entropy mask 0.2", {"loss_type": "dapo", "top_entropy_quantile": 0.2}, ("entropies",)),
    ("dapo + entropy bonus 0.01", {"loss_type": "dapo", "entropy_coef": 0.01}, ("entropies",)),
    (
        "grpo + entropy mask + bonus",
        {"loss_type": "grpo", "top_entropy_quantile": 0.2, "entropy_coef": 0.01},
        ("entropies",),
    ),
]

# (name, loss_mode, PolicyLossConfig settings, ActorConfig fields, extra): every verl 0.9.1 registered loss but
# bypass_mode (the rollout correction's, in --only offpolicy), its KL loss and its entropy bonus
VERL_FAMILIES: list[tuple[str, str, dict[str, Any], dict[str, Any], tuple[str, ...]]] = [
    ("vanilla", "vanilla", {}, {}, ()),
    ("gspo", "gspo", {}, {"clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4, "loss_agg_mode": "seq-mean-token-mean"}, ()),
    ("sapo", "sapo", {}, {}, ()),
    ("cispo", "cispo", {}, {}, ()),
    ("gpg", "gpg", {}, {}, ()),
    ("geo_mean (gmpo)", "geo_mean", {}, {}, ()),
    ("clip_cov", "clip_cov", {}, {}, ()),
    ("kl_cov", "kl_cov", {}, {}, ()),
    ("dppo_tv", "dppo_tv", {}, {}, ()),
    ("dppo_kl", "dppo_kl", {}, {}, ()),
    ("dro", "dro", {"dro_beta": 0.1}, {}, ()),
    ("vanilla + kl low_var_kl", "vanilla", {}, {"use_kl_loss": True, "kl_loss_coef": 0.001}, ()),
    ("vanilla + kl k3+", "vanilla", {}, {"use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "k3+"}, ()),
    ("vanilla + entropy_coeff 0.01", "vanilla", {}, {"entropy_coeff": 0.01}, ("entropies",)),
]


def families(t: Tensors, root: Path, only: str | None = None) -> list[Family]:
    trl = TrlTrainers(root)
    out = [trl.family(name, t, dict(s), extra) for name, s, extra in TRL_FAMILIES]
    for name, mode, policy, fields, extra in VERL_FAMILIES:
        out.append(verl_family(name, t, verl_actor_config(mode, policy, **fields), extra))
    return [f for f in out if only is None or only in f.name]


# Both sides compute the same float32 formulas in different orders: a few ulps of the loss apart. Past this the
# pair would not be the same computation, and its timing would mean nothing: the program exits 1.
AGREEMENT = 1e-5


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs() / b.double().abs().clamp(min=1e-12))


def agreed(name: str, diff: float) -> bool:
    if diff <= AGREEMENT:
        return True
    print(f"MISMATCH: {name}: the two losses are {diff:.1e} apart (> {AGREEMENT:.0e}): not the same computation")
    return False


def bench_families(t: Tensors, repeats: int, only: str | None) -> bool:
    print(f"-- families: grpo.evaluate vs the trainer's own loss + backward, medians of {repeats}")
    print(f"{'family':38s} {'evaluate':>10s} {'trainer':>10s} {'ratio':>7s}   loss |diff|/|loss|")
    with tempfile.TemporaryDirectory() as tmp:
        chosen = families(t, Path(tmp), only)
    ratios, ok = [], True
    for f in chosen:
        lens = grpo.evaluate(f.batch, f.config)
        trainer = f.trainer_loss()
        diff = rel_diff(lens.loss, trainer)
        ok = agreed(f.name, diff) and ok

        def subject(f: Family = f) -> None:
            grpo.evaluate(f.batch, f.config)

        lens_t, trainer_t = (statistics.median(x) for x in time_interleaved([subject, f.trainer_loss], repeats))
        ratios.append((f.name, lens_t / trainer_t))
        print(f"{f.name:38s} {lens_t * 1e3:8.2f}ms {trainer_t * 1e3:8.2f}ms {lens_t / trainer_t:6.2f}x   {diff:.1e}")
    worst = max(ratios, key=lambda r: r[1])
    above = [name for name, r in ratios if r > 1.0]
    print(f"largest ratio: {worst[1]:.2f}x ({worst[0]}) (target <= 1.5x); above 1.0x: {', '.join(above) or 'none'}")
    return ok


# --- off-policy ---------------------------------------------------------------------------------
THRESHOLD = "1e-4_3.0"


def bench_offpolicy(t: Tensors, repeats: int) -> bool:
    from verl.trainer.ppo import rollout_corr_helper

    from grpo.trainer_config import map_trl, map_verl

    actor = verl_actor_config("vanilla")
    rollout_correction = {"rollout_is": "sequence", "rollout_is_threshold": THRESHOLD}

    def verl_corrected() -> torch.Tensor:
        proto, kept, _ = rollout_corr_helper.compute_rollout_correction_and_rejection_mask(
            old_log_prob=t["old"],
            rollout_log_prob=t["sampler"],
            response_mask=t["mask"],
            rollout_is=rollout_correction["rollout_is"],
            rollout_is_threshold=rollout_correction["rollout_is_threshold"],
        )
        weights = None if proto is None else proto.batch["rollout_is_weights"]
        leaf = t["logp"].clone().requires_grad_(True)
        out = verl_actor_loss(actor, {**t, "mask": kept}, leaf, weights)
        out.backward()
        return out.detach()

    batch = as_batch(t, "sampler", ref=False)  # neither loss has a KL term
    verl_config = map_verl(actor, {"rollout_correction": rollout_correction})
    trl_config = map_trl(
        {"loss_type": "dapo", "use_vllm": True, "vllm_importance_sampling_mode": "sequence_mask"}
    )  # TRL's default correction under vLLM: sequence_mask, clip_max 3.0
    assert not verl_config.unsupported and not trl_config.unsupported
    subjects = {
        "verl rollout_is sequence 1e-4_3.0": verl_config.config,
        "trl sequence_mask (dapo, cap 3.0)": trl_config.config,
    }
    reference = verl_corrected()
    masked = grpo.evaluate(batch, verl_config.config)
    print(
        f"-- offpolicy: with the sampler's log-probs (bf16-like noise 0.02 nats per token), against verl's "
        f"vanilla loss + backward with compute_rollout_correction_and_rejection_mask({rollout_correction}) inside "
        f"the timing; medians of {repeats}"
    )
    kept_rows = int(((masked.tokens.is_weight > 0).any(-1)).sum())
    print(f"verl's correction keeps {kept_rows} of {t['mask'].shape[0]} rows (IcePop mask outside [1e-4, 3.0])")
    print(f"{'subject':38s} {'evaluate':>10s} {'verl':>10s} {'ratio':>7s}   loss |diff|/|verl's|")
    ok = agreed("verl rollout_is", rel_diff(masked.loss, reference))
    for name, config in subjects.items():
        lens = grpo.evaluate(batch, config)
        diff = rel_diff(lens.loss, reference) if config is verl_config.config else float("nan")

        def subject(config: grpo.LossConfig = config) -> None:
            grpo.evaluate(batch, config)

        lens_t, verl_t = (statistics.median(x) for x in time_interleaved([subject, verl_corrected], repeats))
        print(f"{name:38s} {lens_t * 1e3:8.2f}ms {verl_t * 1e3:8.2f}ms {lens_t / verl_t:6.2f}x   {diff:.1e}")
    print("target <= 1.0x (the trl line: another loss and correction, timed against the same verl baseline)")
    return ok


def main(argv: list[str] | None = None) -> int:
    keep_freed_memory()  # the program decides: large (B, T) buffers stay in the heap between calls
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--preset", default="article")
    parser.add_argument("--only", default="article,families,offpolicy", help="comma-separated: which benchmarks")
    parser.add_argument("--family", default=None, help="families: only those whose name contains this")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 8 x 64 tokens, 2 repeats")
    parser.add_argument(
        "--clock", choices=list(CLOCKS), default="wall", help="cpu: this thread's CPU time, torch on one thread"
    )
    args = parser.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.clock == "cpu":
        torch.set_num_threads(1)  # every operation runs in this thread: its CPU time is the whole cost
    rows, tokens, repeats = (8, 64, 2) if args.quick else (args.rows, args.tokens, args.repeats)
    t = ragged_batch(rows, tokens)
    print(
        f"batch: {rows} x {tokens} ragged ({int(t['mask'].sum())} counted tokens), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {args.clock} time"
    )
    chosen = args.only.split(",")
    ok = True
    if "article" in chosen:
        bench_article(t, repeats, args.preset)
    if "families" in chosen:
        ok = bench_families(t, repeats, args.family) and ok
    if "offpolicy" in chosen:
        ok = bench_offpolicy(t, repeats) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
