"""The golden corpus: every number and sentence GRPO Lens gives for a fixed set of batches and configs, bit for bit.

``record`` evaluates every case and writes what it gives; ``compare`` evaluates them again and says which differ.
A restructuring that must change no number is checked by recording at the commit before it and comparing after:

    .venv/bin/python bench/golden.py record /tmp/golden_base.json.gz    # at the base commit
    .venv/bin/python bench/golden.py compare /tmp/golden_base.json.gz   # after the change: exit 0 when equal

A case is a batch (an ``/api/v1/loss`` request's fields) and a config (a preset and overrides): every preset and
every objective on each of the page's example batches (grpo.examples), every advantage estimator, every rollout
correction and rejection option with the sampler's log-probs, per-token advantages, token-level rewards, and the
settings with code paths of their own (clamps, KL estimators and gradients, entropies, tool mask, router loss,
aggregations, dtypes). Recorded per case: every tensor of the Breakdown (its bytes), every float as ``float.hex``,
the counts, ``/api/v1/loss``'s answer (grpo.answer.breakdown_to_json, serialised by grpo.answer.dumps) with all its
sentences, and ``compute_loss``'s value and gradient; or the error a case raises. The corpus is not stored in the
repository: floats may differ between CPUs, so both sides run on the same machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpo
from grpo.corrections import CORRECTIONS, RS_CRITERIA
from grpo.requests import batch_from_request
from grpo.view.answer import breakdown_to_json, dumps
from grpo.view.examples import SCENARIOS


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    request: dict[str, Any]
    """The batch's fields, as an /api/v1/loss request holds them (ragged rows)."""
    preset: str
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)


def _rows(g: torch.Generator, lengths: list[int], low: float, high: float) -> list[list[float]]:
    """Ragged rows of values in [low, high), rounded to 4 decimals."""
    return [[round(low + (high - low) * float(torch.rand((), generator=g)), 4) for _ in range(n)] for n in lengths]


def random_request(seed: int, sampler: bool = False, per_token_advantages: bool = False) -> dict[str, Any]:
    """Six rows in two groups of three, ragged (one with no counted token): log-probs, rewards, entropies, a tool mask,
    the extra fields some estimators read; with ``sampler`` the sampler's log-probs (one token unscored: NaN)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 7, 4, 6, 3, 7]
    logp = _rows(g, lengths, -3.0, -0.05)
    request: dict[str, Any] = {
        "per_token_logps": logp,
        "old_per_token_logps": [
            [min(round(v + d, 4), -0.001) for v, d in zip(r, s, strict=True)]
            for r, s in zip(logp, _rows(g, lengths, -0.6, 0.6), strict=True)
        ],
        "ref_per_token_logps": _rows(g, lengths, -3.0, -0.05),
        "entropies": _rows(g, lengths, 0.0, 3.0),
        "completion_mask": [
            [0 if i == 2 or (i == 4 and j == 0) else 1 for j in range(n)] for i, n in enumerate(lengths)
        ],
        "group_size": 3,
        "tokens": [[f"t{i}" for i in range(n)] for n in lengths],
    }
    if per_token_advantages:
        request["advantages"] = _rows(g, lengths, -1.5, 1.5)
    else:
        request["rewards"] = [1.0, 0.0, 0.5, 1.0, 1.0, 0.0]
    if sampler:
        sampled = [
            [min(round(v + d, 4), -0.001) for v, d in zip(r, s, strict=True)]
            for r, s in zip(logp, _rows(g, lengths, -0.8, 0.8), strict=True)
        ]
        sampled[1][2] = math.nan
        request["sampling_per_token_logps"] = sampled
    return request


def _scenario_cases() -> Iterator[Case]:
    for name, scenario in SCENARIOS.items():
        request = scenario.request
        yield Case(f"{name}/own", request, scenario.preset, dict(scenario.overrides))
        for preset in grpo.PRESETS:
            yield Case(f"{name}/preset/{preset}", request, preset)
        for objective in grpo.OBJECTIVES.names():
            yield Case(f"{name}/objective/{objective}", request, scenario.preset, {"objective": objective})
        yield Case(f"{name}/objective/dro/beta", request, scenario.preset, {"objective": "dro", "dro_beta": 0.1})


def _advantage_cases() -> Iterator[Case]:
    request = random_request(1)
    g = torch.Generator().manual_seed(2)
    lengths = [len(row) for row in request["per_token_logps"]]
    request |= {"reward_baselines": [0.5, 0.0, 0.5, 1.0, 0.0, 0.5], "sum_pi_squared": _rows(g, lengths, 0.05, 0.9)}
    rewards = request["rewards"]
    # verl's token_level_rewards in place of rewards: the row's reward on its last token, a step reward before it
    on_tokens = {k: v for k, v in request.items() if k != "rewards"}
    placed = [[0.0] * (n - 2) + [0.25, r] for n, r in zip(lengths, rewards, strict=True)]
    on_tokens["token_level_rewards"] = [  # 0 where a token does not count, as the batch requires
        [v * m for v, m in zip(row, mask, strict=True)]
        for row, mask in zip(placed, request["completion_mask"], strict=True)
    ]
    for estimator in grpo.ADVANTAGES.names():
        for preset in ("trl-grpo", "verl-grpo"):
            yield Case(f"advantage/{estimator}/{preset}", request, preset, {"advantage": estimator})
        yield Case(f"token_level_rewards/{estimator}", on_tokens, "verl-grpo", {"advantage": estimator})
    multi = {**request, "rewards": [[1, 0], [0, 1], [1, 1], [0, 0], [1, 0], [0.5, 1]], "reward_weights": [1.0, 0.5]}
    for estimator in ("group", "gdpo", "normalize-then-sum"):
        yield Case(f"advantage/multi-reward/{estimator}", multi, "trl-grpo", {"advantage": estimator})


def _off_policy_cases() -> Iterator[Case]:
    request = random_request(3, sampler=True)
    for mode in CORRECTIONS.names():
        for preset in ("trl-grpo", "verl-grpo", "trl-gspo"):
            yield Case(f"correction/{mode}/{preset}", request, preset, {"rollout_correction": mode})
        yield Case(
            f"correction/{mode}/bypass", request, "verl-grpo", {"rollout_correction": mode, "rollout_bypass": True}
        )
        yield Case(
            f"correction/{mode}/normalized",
            request,
            "verl-grpo",
            {"rollout_correction": mode, "rollout_is_batch_normalize": True, "rollout_is_min": 0.5},
        )
    for criterion in RS_CRITERIA:
        yield Case(
            f"rollout_rs/{criterion}", request, "verl-grpo", {"rollout_rs": criterion, "rollout_rs_threshold": "1.5"}
        )
    yield Case(
        "rollout_rs/with-is",
        request,
        "verl-grpo",
        {
            "rollout_rs": "token_k1,seq_mean_k3",
            "rollout_rs_threshold": "0.6_1.5,2.0",
            "rollout_correction": "token_truncate",
        },
    )
    for preset in ("trl-grpo", "verl-grpo"):
        yield Case(f"off_policy_mask/{preset}", request, preset, {"off_policy_mask_threshold": 0.05})
        without = {k: v for k, v in request.items() if k != "sampling_per_token_logps"}
        yield Case(f"off_policy_mask/no-sampler/{preset}", without, preset, {"off_policy_mask_threshold": 0.05})
        yield Case(f"correction/no-sampler/{preset}", without, preset, {"rollout_correction": "token_mask"})


def _per_token_cases() -> Iterator[Case]:
    request = random_request(4, per_token_advantages=True)
    for preset in grpo.PRESETS:
        yield Case(f"per_token_advantages/{preset}", request, preset)
    yield Case("per_token_advantages/seq-token-gradient", request, "verl-gspo", {"sequence_ratio_gradient": "token"})
    sampled = random_request(5, sampler=True, per_token_advantages=True)
    yield Case("per_token_advantages/corrected", sampled, "verl-grpo", {"rollout_correction": "sequence_truncate"})


def _setting_cases() -> Iterator[Case]:
    request = random_request(6)
    no_ref = {k: v for k, v in request.items() if k != "ref_per_token_logps"}
    on_policy = {k: v for k, v in no_ref.items() if k != "old_per_token_logps"}
    extreme = {**no_ref, "old_per_token_logps": [list(r) for r in no_ref["old_per_token_logps"]]}
    extreme["old_per_token_logps"][0][1] = -120.0  # a ratio that overflows float32
    tool = {
        **request,
        "tool_mask": [
            [1] * n if i != 1 else [1, 1, 0, 0, 1, 1, 1]
            for i, n in enumerate(len(r) for r in request["per_token_logps"])
        ],
    }
    settings: list[tuple[str, dict[str, Any], str, dict[str, Any]]] = [
        ("entropy-mask", request, "trl-grpo", {"top_entropy_quantile": 0.5}),
        ("entropy-bonus/mean", request, "trl-grpo", {"entropy_coef": 0.01}),
        ("entropy-bonus/aggregation", request, "verl-grpo", {"entropy_coef": 0.01, "entropy_weighting": "aggregation"}),
        ("router-loss", request, "trl-grpo", {"aux_loss_coef": 0.001, "aux_loss": 2.5}),
        ("accumulation", request, "trl-dapo", {"gradient_accumulation_steps": 4, "beta": 0.02}),
        ("float64", request, "verl-grpo", {"dtype": "float64"}),
        ("clamps", request, "verl-grpo", {"log_ratio_clamp": 0.3, "kl_log_ratio_clamp": 0.2, "kl_clamp": 0.05}),
        ("seq-clamp", request, "verl-gspo", {"seq_log_ratio_clamp": 0.01}),
        ("delta-dual", request, "trl-grpo", {"delta": 1.2, "dual_clip": 2.0}),
        ("tool-mask", tool, "verl-grpo", {}),
        ("extreme/float32", extreme, "trl-grpo", {"beta": 0.0}),
        ("extreme/bias", extreme, "trl-grpo", {"beta": 0.0, "kl_bias_correction": True}),
        ("on-policy", on_policy, "article", {}),
    ]
    for name, req, preset, overrides in settings:
        yield Case(f"setting/{name}", req, preset, overrides)
    for estimator in grpo.KL_ESTIMATORS.names():
        for gradient in ("estimator", "k2"):
            for bias in (False, True):
                kl = {"kl_estimator": estimator, "kl_gradient": gradient, "kl_bias_correction": bias}
                yield Case(f"kl/{estimator}/{gradient}/{bias}", request, "verl-grpo", {**kl, "beta": 0.04})
                yield Case(f"kl/{estimator}/{gradient}/{bias}/no-ref", no_ref, "verl-grpo", {**kl, "beta": 0.0})
    for aggregation in grpo.AGGREGATIONS.names():
        yield Case(f"aggregation/{aggregation}", request, "verl-grpo", {"aggregation": aggregation})


def cases() -> list[Case]:
    return [*_scenario_cases(), *_advantage_cases(), *_off_policy_cases(), *_per_token_cases(), *_setting_cases()]


def encode(value: Any) -> Any:
    """JSON for a value, exact: a tensor's dtype, shape and bytes; a float's hex; dataclasses field by field."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return {
            "dtype": str(t.dtype),
            "shape": list(t.shape),
            "bytes": t.reshape(-1).view(torch.uint8).numpy().tobytes().hex(),
        }
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    raise TypeError(f"cannot encode {type(value).__name__}")


def run_case(case: Case) -> dict[str, Any]:
    """What GRPO Lens gives for one case (or the error it raises)."""
    try:
        config = grpo.LossConfig.from_preset(case.preset, **case.overrides)
        batch = batch_from_request(case.request)
        bd = grpo.evaluate(batch, config)
        lengths = [len(row) for row in case.request["per_token_logps"]]
        answer = dumps(breakdown_to_json(bd, lengths, case.request.get("tokens"))).decode()
        trained = batch_from_request(case.request)
        logp = trained.per_token_logps.requires_grad_(True)
        loss = grpo.compute_loss(trained, config)
        (grad,) = torch.autograd.grad(loss, [logp])
    except grpo.GrpoInputError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {"breakdown": encode(bd), "answer": answer, "compute_loss": encode({"loss": loss, "grad": grad})}


def record(selected: list[Case]) -> dict[str, Any]:
    return {case.name: run_case(case) for case in selected}


def differences(a: Any, b: Any, path: str = "") -> Iterator[str]:
    """Paths where two records differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                yield f"{path}/{key}: only in {'base' if key in a else 'now'}"
            else:
                yield from differences(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from differences(x, y, f"{path}/{i}")
    elif isinstance(a, str) and isinstance(b, str) and a != b:  # the first difference, with its context
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        yield f"{path} at {at}: ...{a[max(at - 60, 0) : at + 60]!r} != ...{b[max(at - 60, 0) : at + 60]!r}"
    elif a != b:
        yield f"{path}: {str(a)[:120]} != {str(b)[:120]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["record", "compare"])
    parser.add_argument("path", type=Path, help="the corpus, .json.gz")
    args = parser.parse_args()
    now = record(cases())
    if args.command == "record":
        with gzip.open(args.path, "wt") as f:
            json.dump(now, f)
        print(f"recorded {len(now)} cases ({sum('error' in r for r in now.values())} errors) in {args.path}")
        return 0
    with gzip.open(args.path, "rt") as f:
        base = json.load(f)
    diffs = list(differences(base, now))
    for line in diffs[:40]:
        print(line)
    print(
        f"{len(now)} cases, {len(base)} recorded: {'equal bit for bit' if not diffs else f'{len(diffs)} differences'}"
    )
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
