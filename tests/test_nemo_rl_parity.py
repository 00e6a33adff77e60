"""``map_nemo_rl`` against NeMo RL's own ``ClippedPGLossFn``, when a NeMo RL checkout is at hand.

NeMo RL cannot be installed here (PyPI's ``nemo-rl`` is an empty 0.0.0 placeholder; the real package pins CUDA
builds, Megatron and vLLM), so CI skips this file. Given ``NEMO_RL_SRC`` (a checkout or source snapshot, e.g.
NVIDIA-NeMo/RL at commit 7ea279a, the one ``grpo.importers.nemo_rl`` was read from), it loads
``nemo_rl/algorithms/loss/loss_functions.py`` and ``nemo_rl/algorithms/utils.py`` from there, unchanged, with the
modules they import for other losses (cross-tokenizer distillation, tensor parallelism, chat templates) stood in
by empty ones, and calls ``ClippedPGLossFn`` on the same tensors as ``grpo.evaluate`` under ``map_nemo_rl``'s
config: the value and the gradient of every setting the mapping says it reproduces, on ragged batches with an
empty row, a sample masked out and extreme ratios.

Run: NEMO_RL_SRC=/path/to/RL .venv/bin/python -m pytest tests/test_nemo_rl_parity.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
from grpo.corrections import KEPT
from grpo.importers.nemo_rl import map_nemo_rl, read_config, step_config

SRC = os.environ.get("NEMO_RL_SRC")
pytestmark = [
    pytest.mark.numerical,
    pytest.mark.skipif(SRC is None, reason="NEMO_RL_SRC is not set: NeMo RL cannot be installed here"),
]

# Modules the two files import for other losses and for their package's set-up, none of them on the path of
# ClippedPGLossFn: each an empty module whose every attribute is a placeholder.
STOOD_IN = (
    "nemo_rl.algorithms.x_token",
    "nemo_rl.algorithms.x_token.loss_utils",
    "nemo_rl.data",
    "nemo_rl.data.chat_templates",
    "nemo_rl.distributed",
    "nemo_rl.distributed.batched_data_dict",
    "nemo_rl.distributed.model_utils",
    "nemo_rl.models",
    "nemo_rl.models.dtensor",
    "nemo_rl.models.dtensor.parallelize",
    "nemo_rl.models.policy",
    "nemo_rl.utils",
    "nemo_rl.utils.fastokens",
    "nemo_rl.utils.logger",
)


class _Placeholder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __class_getitem__(cls, item: Any) -> type:
        return cls


def _module(name: str, path: Path | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []  # type: ignore[attr-defined]

    def placeholder(attr: str) -> type:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder

    module.__getattr__ = placeholder  # type: ignore[method-assign]
    return module


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def nemo() -> Any:
    root = Path(str(SRC)) / "nemo_rl"
    saved = {k: v for k, v in sys.modules.items() if k == "nemo_rl" or k.startswith("nemo_rl.")}
    saved_transformers = sys.modules.get("transformers")
    try:
        # utils.py's tokenizer helpers import transformers' AutoProcessor (torchvision): not on this path
        sys.modules["transformers"] = _module("transformers")
        sys.modules["nemo_rl"] = _module("nemo_rl", root)
        sys.modules["nemo_rl.algorithms"] = _module("nemo_rl.algorithms", root / "algorithms")
        sys.modules["nemo_rl.algorithms.loss"] = _module("nemo_rl.algorithms.loss", root / "algorithms" / "loss")
        for name in STOOD_IN:
            sys.modules[name] = _module(name)
        _load("nemo_rl.algorithms.utils", root / "algorithms" / "utils.py")
        _load("nemo_rl.algorithms.loss.interfaces", root / "algorithms" / "loss" / "interfaces.py")
        yield _load("nemo_rl.algorithms.loss.loss_functions", root / "algorithms" / "loss" / "loss_functions.py")
    finally:
        for key in [k for k in sys.modules if k == "nemo_rl" or k.startswith("nemo_rl.")]:
            del sys.modules[key]
        sys.modules.update(saved)
        if saved_transformers is not None:
            sys.modules["transformers"] = saved_transformers
        else:
            sys.modules.pop("transformers", None)


def batch(seed: int) -> dict[str, torch.Tensor]:
    """8 ragged rows of 9 tokens (one empty), ratios up to e^±1.5, one sample masked out (sample_mask 0), advantages
    per token as NeMo RL hands them (each row's value on its tokens), a sampler's log-probs."""
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 9
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[3] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    prev = -(torch.rand(B, T, generator=g, dtype=torch.float64) * 3 + 0.05)
    step = (0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(-1.5, 1.5)
    curr = (prev + step).clamp(max=-1e-3)
    gen = (prev + 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    ref = (curr + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    advantages = torch.randn(B, generator=g, dtype=torch.float64) * torch.tensor([(-1.0) ** i for i in range(B)])
    sample_mask = torch.ones(B, dtype=torch.float64)
    sample_mask[5] = 0.0
    return {
        "curr": curr,
        "prev": prev,
        "gen": gen,
        "ref": ref,
        "mask": mask,
        "sample_mask": sample_mask,
        "advantages": advantages,
    }


def nemo_loss(nemo: Any, cfg: dict[str, Any], b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, d loss / d curr) from ClippedPGLossFn; its data carries a leading position it drops ([:, 1:])."""
    fn = nemo.ClippedPGLossFn(nemo.ClippedPGLossConfig(**cfg))

    def shifted(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros_like(x[:, :1]), x], dim=1)

    B, T = b["mask"].shape
    data = {
        "token_mask": shifted(b["mask"]),
        "sample_mask": b["sample_mask"],
        "advantages": shifted(b["advantages"][:, None].expand(B, T).contiguous()),
        "prev_logprobs": shifted(b["prev"]),
        "generation_logprobs": shifted(b["gen"]),
        "reference_policy_logprobs": shifted(b["ref"]),
    }
    curr = b["curr"].clone().requires_grad_(True)
    counted = b["mask"] * b["sample_mask"][:, None]
    loss, _ = fn(curr, data, global_valid_seqs=b["sample_mask"].sum(), global_valid_toks=counted.sum())
    (grad,) = torch.autograd.grad(loss, curr)
    return loss.detach(), grad


def lens(cfg: dict[str, Any], b: dict[str, torch.Tensor]) -> grpo.Breakdown:
    """grpo.evaluate under map_nemo_rl's config with the step's counts, as the import sets them (step_config)."""
    counted = b["mask"] * b["sample_mask"][:, None]  # NeMo RL's mask = token_mask · sample_mask
    mapping = map_nemo_rl(cfg)
    config = step_config(grpo.LossConfig.resolve({"dtype": "float64"}, base=mapping.config), counted, b["sample_mask"])
    return grpo.evaluate(
        grpo.Batch(
            per_token_logps=b["curr"],
            old_per_token_logps=b["prev"],
            ref_per_token_logps=b["ref"],
            sampling_per_token_logps=b["gen"],
            completion_mask=counted,
            advantages=b["advantages"],
        ),
        config,
    )


# Settings map_nemo_rl reproduces in value and gradient (beta 0: NeMo RL's KL carries exp(logp - sg(logp)), whose
# score-function gradient the mapping leaves out and says so; its value is checked below).
CASES: list[dict[str, Any]] = [
    {"reference_policy_kl_penalty": 0.0},
    {"reference_policy_kl_penalty": 0.0, "ratio_clip_min": 0.2, "ratio_clip_max": 0.28},
    {"reference_policy_kl_penalty": 0.0, "ratio_clip_c": 3.0},
    {"reference_policy_kl_penalty": 0.0, "token_level_loss": False},
    {"reference_policy_kl_penalty": 0.0, "token_level_loss": False, "sequence_level_importance_ratios": True},
    {"reference_policy_kl_penalty": 0.0, "use_cispo": True},
    {"reference_policy_kl_penalty": 0.0, "disable_ppo_ratio": True},
    {"reference_policy_kl_penalty": 0.0, "use_kl_in_reward": True},
]
# The importance-sampling correction: plain, tis, icepop, seq-mask-tis, per token and per sequence
IS = {"reference_policy_kl_penalty": 0.0, "use_importance_sampling_correction": True}
TIS = {"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 1.04}
ICEPOP = {
    "truncated_importance_sampling_type": "icepop",
    "truncated_importance_sampling_ratio": 1.05,
    "truncated_importance_sampling_ratio_min": 0.96,
}
GSPO = {"sequence_level_importance_ratios": True, "token_level_loss": False}
CASES += [
    IS,
    IS | TIS,
    IS | TIS | {"truncated_importance_sampling_ratio_min": 0.97, "ratio_clip_c": 3.0},
    IS | TIS | {"token_level_loss": False},
    IS | ICEPOP,
    IS | ICEPOP | {"ratio_clip_max": 0.28},
    IS
    | {
        "truncated_importance_sampling_type": "seq-mask-tis",
        "truncated_importance_sampling_ratio": 1.01,
        "truncated_importance_sampling_ratio_min": 0.99,
    },
    IS | GSPO,
    IS | GSPO | {"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 1.1},
    IS | GSPO | ICEPOP | {"truncated_importance_sampling_ratio": 1.1, "truncated_importance_sampling_ratio_min": 0.9},
    IS | {"use_cispo": True} | TIS,
]


@pytest.mark.parametrize("cfg", CASES, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_value_and_gradient_equal_nemo_rl(nemo: Any, cfg: dict[str, Any], seed: int) -> None:
    b = batch(seed)
    mapping = map_nemo_rl(cfg)
    assert not mapping.unsupported, mapping.unsupported
    loss, grad = nemo_loss(nemo, cfg, b)
    bd = lens(cfg, b)
    # float64 round-off, but for GSPO's ratio: NeMo RL's row mean of the log-ratios divides by (n + 1e-8), GRPO
    # Lens's by n (TRL's and verl's): each row's ratio differs by a relative 1e-8 · |mean log-ratio| (< 1.5e-8
    # here), so each row's term and each token's gradient by as much, and the loss by that share of Σ|terms|
    off = 2e-8 if cfg.get("sequence_level_importance_ratios") else 1e-14
    scale = float(bd.tokens.loss.abs().sum()) + 1e-3
    torch.testing.assert_close(bd.loss, loss, rtol=1e-11, atol=off * scale)
    torch.testing.assert_close(bd.tokens.grad, grad, rtol=max(off, 1e-11), atol=1e-14)


@pytest.mark.parametrize("cfg", [c for c in CASES if c.get("use_importance_sampling_correction")], ids=str)
def test_the_importance_sampling_cases_correct_something(nemo: Any, cfg: dict[str, Any]) -> None:
    """Each correction case above moves NeMo RL's loss, and a bound (truncated, masked, or a row left out) acts on
    at least one counted token when the case sets one: the equality above is not that of two uncorrected losses."""
    b = batch(0)
    loss, _ = nemo_loss(nemo, cfg, b)
    off, _ = nemo_loss(nemo, {**cfg, "use_importance_sampling_correction": False, **dict.fromkeys(TIS, None)}, b)
    assert abs(float(loss - off)) > 1e-4 * abs(float(off))
    if cfg.get("truncated_importance_sampling_type"):
        codes = lens(cfg, b).tokens.correction[b["mask"].bool()]
        assert bool((codes > KEPT).any())


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3"])
@pytest.mark.parametrize("token_level", [True, False])
def test_the_kl_penalty_s_value_equals_nemo_rl(nemo: Any, kl_type: str, token_level: bool) -> None:
    """With beta > 0 the value is reproduced (the mapping says its gradient's score-function term is not)."""
    cfg = {"reference_policy_kl_penalty": 0.05, "reference_policy_kl_type": kl_type, "token_level_loss": token_level}
    b = batch(7)
    loss, _ = nemo_loss(nemo, cfg, b)
    assert "reference_policy_kl_penalty" in map_nemo_rl(cfg).unsupported
    torch.testing.assert_close(lens(cfg, b).loss, loss, rtol=1e-11, atol=1e-14)


def test_read_config_composes_every_example_config_as_nemo_rl_s_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_config`` against NeMo RL's ``load_config`` (``nemo_rl/utils/config.py``, hydra stood in: only its
    override parser imports it) on every config of its ``examples/configs``: the same composed config, section by
    section, so the same loss settings (before, 56 of them that inherit mapped to other loss settings)."""
    from omegaconf import OmegaConf

    for name in ("hydra", "hydra._internal", "hydra.core", "hydra.core.override_parser"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    impl, parser = types.ModuleType("impl"), types.ModuleType("parser")
    impl.ConfigLoaderImpl = parser.OverridesParser = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hydra._internal.config_loader_impl", impl)
    monkeypatch.setitem(sys.modules, "hydra.core.override_parser.overrides_parser", parser)
    loader = _load("nemo_rl_utils_config", Path(str(SRC)) / "nemo_rl" / "utils" / "config.py")
    monkeypatch.delitem(sys.modules, "nemo_rl_utils_config")
    paths = sorted((Path(str(SRC)) / "examples" / "configs").rglob("*.yaml"))
    assert len(paths) > 200
    for path in paths:
        theirs = loader.load_config(path)
        expected = OmegaConf.to_container(theirs, resolve=False)
        assert isinstance(expected, dict)
        if "loss_fn" in theirs:
            expected["loss_fn"] = OmegaConf.to_container(theirs.loss_fn, resolve=True)
        assert read_config(path) == expected, path
