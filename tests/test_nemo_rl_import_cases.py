"""NeMo RL imports case by case: a config that inherits through ``defaults:`` maps to the settings NeMo
RL's own loader gives it; ``force_on_policy_ratio``'s placeholder log-probs are read as NeMo RL means them; the
importance-sampling correction (plain, ``tis``, ``icepop``, ``seq-mask-tis``) reproduces ``ClippedPGLossFn``; a
hostile dump exits 2 with one line and leaves nothing.

CI runs all of it. NeMo RL's loader (``nemo_rl/utils/config.py`` at 7ea279a) and several of its example configs with
their whole inheritance chains are copied unchanged into ``tests/data/nemo_rl_configs``; the loader runs here with
OmegaConf (hydra stood in: the loader never calls it). The loss cases are hand-built: with the old log-probs as the
current ones every ratio is 1, so ``ClippedPGLossFn``'s clipped term is -A on every token (the dual clip's
min(-A, -c·A) is -A for c > 1) and its loss is the masked mean of w · (-A), w the IS weight; ``nemo_is_loss``
below follows its code line by line in a plain loop. ``tests/test_nemo_rl_parity.py`` (NEMO_RL_SRC) holds the same
settings against NeMo RL's own ``ClippedPGLossFn``, with ratios away from 1.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo.__main__ import main
from grpo.check import check_run
from grpo.errors import GrpoInputError
from grpo.importers import common, nemo_rl
from grpo.runs import load_run, load_step

DATA = Path(__file__).parent / "data" / "nemo_rl_configs"
EXAMPLES = DATA / "examples" / "configs"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys: Any, tmp_path: Path, src: Path, match: str, *more: str) -> str:
    """``import nemo-rl src`` exits 2 with one line naming ``match`` and leaves tmp_path as it was."""
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(capsys, "import", "nemo-rl", str(src), str(tmp_path / "run"), *more)
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith("error: ") and match in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run, no hidden temporary directory
    return err


# --- defaults: NeMo RL's own loader -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nemo_loader() -> Any:
    """NeMo RL's ``nemo_rl/utils/config.py`` at 7ea279a, unchanged, with hydra stood in (only its override parser
    imports hydra; the loader never calls it)."""
    pytest.importorskip("omegaconf")
    stubs = {
        "hydra": None,
        "hydra._internal": None,
        "hydra._internal.config_loader_impl": "ConfigLoaderImpl",
        "hydra.core": None,
        "hydra.core.override_parser": None,
        "hydra.core.override_parser.overrides_parser": "OverridesParser",
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    try:
        for name, attr in stubs.items():
            module = types.ModuleType(name)
            if attr:
                setattr(module, attr, object)
            sys.modules[name] = module
        path = str(DATA / "nemo_rl" / "utils" / "config.py.txt")
        loader = importlib.machinery.SourceFileLoader("nemo_rl_utils_config", path)
        spec = importlib.util.spec_from_loader("nemo_rl_utils_config", loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        yield module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def nemo_loaded(nemo_loader: Any, path: Path) -> dict[str, Any]:
    """What NeMo RL's ``load_config`` gives, as plain data (the copied configs' loss_fn hold no interpolation)."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(nemo_loader.load_config(path), resolve=False)
    assert isinstance(container, dict)
    return container


def settings_of(cfg: Any) -> dict[str, Any]:
    c = nemo_rl.map_nemo_rl(cfg).config
    names = ("epsilon_low", "epsilon_high", "dual_clip", "beta", "kl_estimator", "aggregation")
    more = ("importance_sampling_level", "rollout_correction", "rollout_is_min", "rollout_is_max", "rollout_rs")
    return {name: getattr(c, name) for name in (*names, *more)}


# Each copied config that inherits, with what its loss settings are as NeMo RL's loader composes them, read off the
# files by hand (the file that sets each value in the comment), and what the import gave before (its own file only:
# no loss_fn section, so NeMo RL's ClippedPGLossConfig defaults: clip 0.2/0.2, beta 0.01, k3, token-mean, no IS).
DEFAULTS_ONLY = {
    "epsilon_low": 0.2,
    "epsilon_high": 0.2,
    "dual_clip": None,
    "beta": 0.01,
    "kl_estimator": "k3",
    "aggregation": "token-mean",
    "importance_sampling_level": "token",
    "rollout_correction": "none",
    "rollout_is_min": None,
    "rollout_is_max": 3.0,
    "rollout_rs": None,
}
INHERITING = {
    # -> prorlv2.v2.yaml (k2, beta 1e-4, clip max 0.27, icepop [0.5, 5.0]) -> grpo_math_1B.yaml
    "recipes/llm/prorlv2-qwen2.5-math-1.5b-instruct-1n8g-fsdp2tp1.v2.yaml": DEFAULTS_ONLY
    | {"epsilon_high": 0.27, "beta": 1e-4, "kl_estimator": "k2"}
    | {"rollout_correction": "token_mask", "rollout_is_min": 0.5, "rollout_is_max": 5.0},
    # -> ...-qa-bf16-300step.yaml (beta 0, clip max 0.28, c 10, tis 2.0 with min null = 0) -> ...-16n8g-megatron.yaml
    # -> ../../grpo_math_1B.yaml (three files up: the chain's relative paths from each file's own directory)
    "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-nvfp4-w4a16-real-300step.yaml": DEFAULTS_ONLY
    | {"epsilon_high": 0.28, "dual_clip": 10.0, "beta": 0.0}
    | {"rollout_correction": "token_truncate", "rollout_is_min": 0.0, "rollout_is_max": 2.0},
    # -> grpo-gspo-deepscaler-1.5b-8K.yaml (beta 0, sequence-level ratios, sequence-level loss) -> grpo_math_1B.yaml
    "recipes/llm/grpo-gspo-deepscaler-1.5b-8K-tq_simple.yaml": DEFAULTS_ONLY
    | {"beta": 0.0, "aggregation": "seq-mean-token-mean", "importance_sampling_level": "sequence"},
    # -> ../../../nemo_gym/gdpo_example_tool_call_multireward.yaml -> grpo_workplace_assistant_nemotron_nano_v2_9b.yaml
    # (reference_policy_kl_penalty 0); outside examples/configs, and a nested _override_ left where NeMo RL leaves it
    "recipes/llm/gdpo-qwen2.5-1.5b-1n8g-gym-multireward.yaml": DEFAULTS_ONLY | {"beta": 0.0},
}
# Configs whose composed settings NeMo RL runs but the import cannot reproduce: refused by name
REFUSED = {
    # four files deep: performance/...-2n8g.yaml sets use_importance_sampling_correction and force_on_policy_ratio
    "recipes/llm/grpo-llama3.1-8b-instruct-2n4g-async-1off-single-controller-streaming2.yaml": "force_on_policy_ratio",
    # seq-mask-tis on top of prorlv2.v2.yaml's icepop, with force_on_policy_ratio
    "prorlv2_1_moe.v2.yaml": "force_on_policy_ratio",
}


@pytest.mark.parametrize("name", [*INHERITING, *REFUSED])
def test_a_copied_config_composes_as_nemo_rl_s_loader_does(nemo_loader: Any, name: str) -> None:
    path = EXAMPLES / name
    assert nemo_rl.read_config(path) == nemo_loaded(nemo_loader, path)  # the whole config, every section


@pytest.mark.parametrize("name", INHERITING)
def test_an_inheriting_config_maps_to_the_settings_nemo_rl_resolves(nemo_loader: Any, name: str) -> None:
    path = EXAMPLES / name
    assert settings_of(path) == INHERITING[name]
    assert settings_of(nemo_loaded(nemo_loader, path)) == INHERITING[name]
    assert INHERITING[name] != DEFAULTS_ONLY  # what reading the file alone gave: other loss settings, silently


@pytest.mark.parametrize("name", REFUSED)
def test_an_inheriting_config_the_import_cannot_reproduce_is_refused(name: str, tmp_path: Path, nemo_dir: Path) -> None:
    with pytest.raises(GrpoInputError, match=f"^use_importance_sampling_correction: .*{REFUSED[name]}"):
        nemo_rl.import_nemo_rl(nemo_dir, tmp_path / "run", EXAMPLES / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump"]  # nothing written


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_a_list_in_order_relative_paths_override_and_missing(nemo_loader: Any, tmp_path: Path) -> None:
    """Each rule of load_config on small files, held against NeMo RL's loader: a list of parents merged in order
    (the later wins), each path relative to the file naming it, a top-level ``_override_: true`` section replacing
    the inherited one, a ``???`` keeping what it would replace, YAML's 1e-3 a float as OmegaConf reads it."""
    write(tmp_path / "base" / "root.yaml", "loss_fn:\n  ratio_clip_max: 0.3\n  reference_policy_kl_type: k2\n")
    write(tmp_path / "base" / "a.yaml", "defaults: root.yaml\nloss_fn:\n  ratio_clip_min: 0.1\n  ratio_clip_c: 3\n")
    write(tmp_path / "b.yaml", "loss_fn:\n  ratio_clip_min: 0.15\n  reference_policy_kl_penalty: 1e-3\n")
    child = write(
        tmp_path / "runs" / "child.yaml",
        "defaults:\n  - ../base/a.yaml\n  - ../b.yaml\nloss_fn:\n  ratio_clip_c: ???\n  token_level_loss: false\n",
    )
    composed = nemo_rl.read_config(child)
    assert composed == nemo_loaded(nemo_loader, child)
    assert composed["loss_fn"] == {
        "ratio_clip_max": 0.3,  # root.yaml, through a.yaml
        "reference_policy_kl_type": "k2",
        "ratio_clip_min": 0.15,  # b.yaml comes after a.yaml
        "ratio_clip_c": 3,  # ??? keeps a.yaml's
        "reference_policy_kl_penalty": 0.001,  # 1e-3: a float (PyYAML's safe_load says the string "1e-3")
        "token_level_loss": False,
    }
    replaced = write(tmp_path / "runs" / "replaced.yaml", "defaults: child.yaml\nloss_fn:\n  _override_: true\n")
    assert nemo_rl.read_config(replaced) == nemo_loaded(nemo_loader, replaced) == {"loss_fn": {}}
    assert settings_of(replaced) == DEFAULTS_ONLY  # NeMo RL's defaults, as the section was replaced whole


def test_interpolations_resolve_through_omegaconf_or_are_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("omegaconf")
    write(tmp_path / "parent.yaml", "clip:\n  high: 0.28\nloss_fn:\n  ratio_clip_max: ${clip.high}\n")
    child = write(
        tmp_path / "child.yaml", "defaults: parent.yaml\nclip:\n  high: 0.3\nloss_fn:\n  ratio_clip_c: ${mul:2,1.5}\n"
    )
    # the child's clip.high wins before resolving (NeMo RL resolves after composing); mul is NeMo RL's resolver
    assert nemo_rl.read_config(child)["loss_fn"] == {"ratio_clip_max": 0.3, "ratio_clip_c": 3.0}
    from omegaconf import OmegaConf

    assert not OmegaConf.has_resolver("mul")  # registered for the call only
    broken = write(tmp_path / "broken.yaml", "loss_fn:\n  ratio_clip_max: ${nowhere.high}\n")
    with pytest.raises(GrpoInputError, match=r"loss_fn.ratio_clip_max: expected an interpolation that resolves"):
        nemo_rl.read_config(broken)
    monkeypatch.setitem(sys.modules, "omegaconf", None)  # as without the optional extra: import fails
    with pytest.raises(GrpoInputError, match=r"loss_fn.ratio_clip_max: .*pip install omegaconf"):
        nemo_rl.read_config(child)
    elsewhere = write(tmp_path / "elsewhere.yaml", "defaults: parent.yaml\nloss_fn:\n  ratio_clip_max: 0.25\n")
    assert nemo_rl.read_config(elsewhere)["clip"] == {
        "high": 0.28
    }  # an interpolation the loss does not read is not needed


def test_config_files_that_nemo_rl_would_not_run_are_refused_by_name(tmp_path: Path) -> None:
    cycle = write(tmp_path / "a.yaml", "defaults: b.yaml\n")
    write(tmp_path / "b.yaml", "defaults: a.yaml\n")
    with pytest.raises(GrpoInputError, match=r"defaults: .*without a cycle, got a.yaml -> b.yaml -> a.yaml"):
        nemo_rl.read_config(cycle)
    never = write(tmp_path / "never.yaml", "loss_fn:\n  ratio_clip_max: ???\n")
    with pytest.raises(GrpoInputError, match=r"loss_fn.ratio_clip_max: expected a value \(\?\?\? is mandatory"):
        nemo_rl.map_nemo_rl(never)
    with pytest.raises(GrpoInputError, match=r"^defaults: expected a config read from its file"):
        nemo_rl.map_nemo_rl({"defaults": "grpo_math_1B.yaml", "loss_fn": {}})  # no file: nothing to resolve it against
    clash = write(tmp_path / "clash.yaml", "defaults: b2.yaml\nloss_fn: [1]\n")
    write(tmp_path / "b2.yaml", "loss_fn:\n  ratio_clip_max: 0.2\n")
    with pytest.raises(GrpoInputError, match=r"^loss_fn: expected the same kind of value"):
        nemo_rl.read_config(clash)
    dup = write(tmp_path / "dup.yaml", "loss_fn:\n  ratio_clip_max: 0.2\n  ratio_clip_max: 0.3\n")
    with pytest.raises(GrpoInputError, match="duplicate key ratio_clip_max"):
        nemo_rl.read_config(dup)
    bomb = (
        "a: &a ["
        + ",".join(["x"] * 10)
        + "]\n"
        + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 10) + "]\n" for p, c in zip("abcdefg", "bcdefgh", strict=False))
    )
    with pytest.raises(GrpoInputError, match="once its aliases are expanded"):
        nemo_rl.read_config(write(tmp_path / "bomb.yaml", bomb))


@pytest.fixture
def nemo_dir(tmp_path: Path) -> Path:
    return dump(tmp_path / "dump", [line(-0.2 * (i + 1), adv=1.0 - i) for i in range(3)])


def test_the_command_reads_a_config_s_defaults(nemo_dir: Path, tmp_path: Path, capsys: Any) -> None:
    """``--config FILE`` composes the file as NeMo RL does: grpo/__main__.py reads it through
    grpo.importers.CONFIG_READERS (before: ``defaults`` ignored, NeMo RL's defaults mapped; without that reader the
    import refuses a dict holding ``defaults`` by name, never maps it silently)."""
    name = "recipes/llm/grpo-nemotron3-super-120BA12B-16n4g-megatron-qa-nvfp4-w4a16-real-300step.yaml"
    code, _, err = run(
        capsys, "import", "nemo-rl", str(nemo_dir), str(tmp_path / "run"), "--config", str(EXAMPLES / name)
    )
    assert code == 0, err
    info = load_run(tmp_path / "run").info
    assert {k: info["config"][k] for k in INHERITING[name]} == INHERITING[name]


# --- hand-built dumps ------------------------------------------------------------------------------------------
def line(shift: float, adv: float, width: int = 6, gap: list[float] | None = None, keep: float = 1.0) -> dict[str, Any]:
    """One sample as log_batched_dict_as_jsonl writes it (a batch of one): position 0 the prompt's (never scored),
    tokens 1..width-1 counted; prev = shift - 1.5 - 0.1·t, generation = prev - gap[t] (both < 0 for gaps > -1.5)."""
    gap = gap or [0.0] * width
    prev = [0.0] + [shift - 1.5 - 0.1 * t for t in range(1, width)]
    gen = [0.0] + [p - g for p, g in zip(prev[1:], gap[1:], strict=True)]
    return {
        "prev_logprobs": [prev],
        "generation_logprobs": [gen],
        "token_loss_mask": [[0] + [1] * (width - 1)],
        "advantages": [[adv] * width],
        "sample_loss_mask": [keep],
        "rewards": [adv],
    }


def dump(d: Path, lines: list[dict[str, Any]], step: int = 1) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"train_data_step{step}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return d


def imported_loss(d: Path, run_dir: Path, cfg: dict[str, Any]) -> float:
    result = check_run(load_run(nemo_rl.import_nemo_rl(d, run_dir, cfg)))
    return float(result.micro[0].lens_loss)


def nemo_is_loss(lines: list[dict[str, Any]], cfg: dict[str, Any]) -> float:
    """ClippedPGLossFn (7ea279a) at ratio 1, in a plain loop over its code: clip_loss = -A; the IS weights
    w = exp(prev - gen) per token (or exp(Σ_t (prev - gen)·mask) per row with sequence_level_importance_ratios),
    nan_to_num'd; tis clamps to [min or 0, max]; icepop zeroes outside [min, max]; seq-mask-tis zeroes the rows whose
    exp(masked_mean(prev - gen, token_mask)) is outside [min, max]; then masked_mean(w · clip_loss, mask,
    global_valid_toks) (token level) or masked_mean(masked_mean(·, token_mask, -1), sample_mask, global_valid_seqs)."""
    kind = cfg.get("truncated_importance_sampling_type")
    low, high = cfg.get("truncated_importance_sampling_ratio_min"), cfg.get("truncated_importance_sampling_ratio")
    per_row, toks, seqs = [], 0.0, 0.0
    for x in lines:
        prev, gen = x["prev_logprobs"][0][1:], x["generation_logprobs"][0][1:]
        tmask, keep, adv = x["token_loss_mask"][0][1:], x["sample_loss_mask"][0], x["advantages"][0][1:]
        mask = [m * keep for m in tmask]
        if cfg.get("sequence_level_importance_ratios"):
            w = [math.exp(sum((p - g) * m for p, g, m in zip(prev, gen, mask, strict=True)))] * len(prev)
        else:
            w = [math.exp(p - g) for p, g in zip(prev, gen, strict=True)]
        if kind == "tis":
            w = [min(max(v, low or 0.0), high) for v in w]
        elif kind == "icepop":
            w = [v if low <= v <= high else 0.0 for v in w]
        elif kind == "seq-mask-tis":
            geo = math.exp(sum((p - g) * m for p, g, m in zip(prev, gen, tmask, strict=True)) / (sum(tmask) + 1e-8))
            w = [v if low <= geo <= high else 0.0 for v in w]
        if not cfg.get("use_importance_sampling_correction"):
            w = [1.0] * len(w)
        terms = [v * -a for v, a in zip(w, adv, strict=True)]
        per_row.append((terms, mask, tmask, keep))
        toks += sum(mask)
        seqs += keep
    if cfg.get("token_level_loss", True):
        return sum(t * m for terms, mask, _, _ in per_row for t, m in zip(terms, mask, strict=True)) / (toks + 1e-8)
    rows = [sum(t * m for t, m in zip(terms, tm, strict=True)) / (sum(tm) + 1e-8) * k for terms, _, tm, k in per_row]
    return sum(rows) / (seqs + 1e-8)


GAPS = [0.0, -1.0, -0.3, 0.0, 0.4, 1.2]  # prev - generation per token: weights 0.37, 0.74, 1, 1.49, 3.32
IS_CASES = [
    {"use_importance_sampling_correction": True},
    {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 2.0,
    },
    {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 2.0,
        "truncated_importance_sampling_ratio_min": 0.5,
        "token_level_loss": False,
    },
    {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "icepop",
        "truncated_importance_sampling_ratio": 2.0,
        "truncated_importance_sampling_ratio_min": 0.5,
    },
    {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "seq-mask-tis",
        "truncated_importance_sampling_ratio": 1.3,
        "truncated_importance_sampling_ratio_min": 0.9,
    },
    {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "tis",
        "truncated_importance_sampling_ratio": 2.0,
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
    },
    {
        "use_importance_sampling_correction": True,
        "truncated_importance_sampling_type": "icepop",
        "truncated_importance_sampling_ratio": 4.0,
        "truncated_importance_sampling_ratio_min": 0.5,
        "sequence_level_importance_ratios": True,
        "token_level_loss": False,
    },
]


@pytest.mark.parametrize(
    "cfg",
    IS_CASES,
    ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items() if k != "use_importance_sampling_correction") or "plain",
)
def test_the_importance_sampling_correction_equals_nemo_rl_s(cfg: dict[str, Any], tmp_path: Path) -> None:
    """Four rows: one per gap pattern (weights inside and past the bounds, rows whose geometric mean falls inside
    and outside seq-mask-tis's), one sample masked out, advantages of both signs."""
    lines = [
        line(-0.3, 1.5, gap=GAPS),
        line(-0.5, -0.5, gap=[0.0, 0.05, -0.05, 0.1, 0.0, 0.02]),
        line(-0.2, -1.0, gap=[0.0, 0.3, 0.2, 0.1, 0.4, 0.2], keep=0.0),
        line(-0.4, 0.8, gap=[0.0, -0.2, 0.1, -0.1, 0.3, 0.5]),
    ]
    d = dump(tmp_path / "dump", lines)
    cfg = {"reference_policy_kl_penalty": 0.0, **cfg}
    mapping = nemo_rl.map_nemo_rl(cfg)
    assert "use_importance_sampling_correction" in mapping.mapped and not mapping.unsupported
    expected = nemo_is_loss(lines, cfg)
    without = nemo_is_loss(lines, {**cfg, "use_importance_sampling_correction": False})
    assert abs(expected - without) > 1e-3 * abs(without)  # the correction moves the loss: it is what is checked
    scale = sum(abs(a) for a in (1.5, 0.5, 0.8)) * 3.32
    assert imported_loss(d, tmp_path / "run", cfg) == pytest.approx(expected, rel=1e-6, abs=1e-6 * scale)


def test_an_is_weight_nemo_rl_would_zero_is_refused(tmp_path: Path, capsys: Any) -> None:
    """exp(prev - generation) past float32's largest is inf in NeMo RL's float32 tensors, which it sets to 0
    (nan_to_num(posinf=0)); GRPO Lens would clamp it. Refused at the sample and token."""
    far = dump(tmp_path / "dump", [line(-0.1, 1.0), line(-0.1, -1.0, gap=[0.0, 0.0, 90.0, 0.0, 0.0, 0.0])])
    cfg = write(tmp_path / "c.json", json.dumps({"loss_fn": {"use_importance_sampling_correction": True}}))
    refused(capsys, tmp_path, far, "train_data_step1.jsonl: sample 1 token 2", "--config", str(cfg))
    seq = write(
        tmp_path / "s.json",
        json.dumps(
            {
                "use_importance_sampling_correction": True,
                "sequence_level_importance_ratios": True,
                "token_level_loss": False,
            }
        ),
    )
    wide = dump(tmp_path / "wide", [line(-0.1, 1.0, gap=[0.0, 30.0, 30.0, 30.0, 0.0, 0.0])])
    refused(capsys, tmp_path, wide, "sample 0", "--config", str(seq))
    # without the correction the same dump imports: the weights are not used
    assert run(capsys, "import", "nemo-rl", str(far), str(tmp_path / "plain"))[0] == 0


def test_settings_nemo_rl_refuses_are_refused_by_name() -> None:
    for cfg, name in (
        (
            {"truncated_importance_sampling_type": "tis", "truncated_importance_sampling_ratio": 2.0},
            "truncated_importance_sampling_type",
        ),
        (
            {"use_importance_sampling_correction": True, "truncated_importance_sampling_ratio": 2.0},
            "truncated_importance_sampling_ratio",
        ),
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "icepop",
                "truncated_importance_sampling_ratio": 2.0,
            },
            "truncated_importance_sampling_ratio_min",
        ),
        (
            {"use_importance_sampling_correction": True, "truncated_importance_sampling_type": "tis"},
            "truncated_importance_sampling_ratio",
        ),
        (
            {
                "use_importance_sampling_correction": True,
                "truncated_importance_sampling_type": "mis",
                "truncated_importance_sampling_ratio": 2.0,
            },
            "truncated_importance_sampling_type",
        ),
        ({"use_cispo": True, "force_on_policy_ratio": True}, "use_cispo"),
        (
            {"use_importance_sampling_correction": True, "force_on_policy_ratio": True},
            "use_importance_sampling_correction",
        ),
    ):
        with pytest.raises(GrpoInputError, match=f"^{name}: "):
            nemo_rl.map_nemo_rl(cfg)


# --- force_on_policy_ratio ----------------------------------------------------------------------------------------
def placeholder_dump(d: Path) -> tuple[Path, list[dict[str, Any]]]:
    """NeMo RL with force_on_policy_ratio (grpo.py: train_data["prev_logprobs"] = torch.zeros_like(generation))."""
    lines = [line(-0.3 * (i + 1), adv=a, gap=[0.0, 0.1, -0.1, 0.2, 0.0, 0.1]) for i, a in enumerate((1.0, -0.5, 0.25))]
    for x in lines:
        x["prev_logprobs"] = [[0.0] * len(x["prev_logprobs"][0])]
    return dump(d, lines), lines


def test_force_on_policy_ratio_s_placeholder_is_read_as_nemo_rl_means_it(tmp_path: Path, capsys: Any) -> None:
    """The ratio is 1 (old = current), the run's log-probs are the sampler's, and the mismatch NeMo RL logs against
    its current log-probs (1.014 in the issue's run) is said not recorded, not computed against the zeros (4.56)."""
    d, lines = placeholder_dump(tmp_path / "dump")
    cfg = write(tmp_path / "c.yaml", "loss_fn:\n  force_on_policy_ratio: true\n  reference_policy_kl_penalty: 0.0\n")
    code, _, err = run(capsys, "import", "nemo-rl", str(d), str(tmp_path / "run"), "--config", str(cfg))
    assert code == 0, err
    loaded = load_run(tmp_path / "run")
    batch, _, info = load_step(loaded.steps[0].path)
    gen = torch.tensor([x["generation_logprobs"][0][1:] for x in lines])
    assert torch.equal(batch.per_token_logps, gen.float()) and torch.equal(batch.old_per_token_logps, gen.float())
    assert batch.sampling_per_token_logps is None  # no sampler beside them: a gap of 0 NeMo RL never had
    assert info["meta"]["sampler_vs_old"] == {"not_recorded": nemo_rl.NOT_RECORDED}
    assert (
        nemo_rl.NOT_RECORDED in info["meta"]["cannot_check"]
        and nemo_rl.NOT_RECORDED in loaded.info["imported"]["cannot_check"]
    )
    result = check_run(loaded)
    assert result.verdict == "unchecked" and any(
        reason == nemo_rl.NOT_RECORDED for reason, _ in result.unchecked_reasons()
    )
    # ratio 1: -A over the counted tokens (5 per row), as ClippedPGLossFn's forced ratio gives
    assert result.micro[0].lens_loss == pytest.approx(-(1.0 - 0.5 + 0.25) * 5 / (15 + 1e-8), rel=1e-6)


def test_zeros_without_force_on_policy_ratio_are_refused(tmp_path: Path, capsys: Any) -> None:
    d, _ = placeholder_dump(tmp_path / "dump")
    refused(
        capsys,
        tmp_path,
        d,
        "train_data_step1.jsonl: prev_logprobs: expected the old policy's log-probs: these are all 0",
    )


def test_force_on_policy_ratio_with_real_prev_logprobs_keeps_them(tmp_path: Path) -> None:
    """grpo.seq_logprob_error_threshold set: NeMo RL computes prev_logprobs anyway, and the dump holds them."""
    d = dump(tmp_path / "dump", [line(-0.3, 1.0, gap=[0.0, 0.1, 0.0, 0.0, 0.0, 0.0])])
    batch, _, info = load_step(
        load_run(nemo_rl.import_nemo_rl(d, tmp_path / "run", {"force_on_policy_ratio": True})).steps[0].path
    )
    assert batch.sampling_per_token_logps is not None and info["meta"]["sampler_vs_old"]["tokens"] == 5


# --- hostile dumps ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "token", "value", "shown"),
    [
        ("prev_logprobs", 3, "NaN", "nan"),
        ("prev_logprobs", 0, "-Infinity", "-inf"),  # position 0 too: the loss never reads it, NeMo RL wrote 0 there
        ("generation_logprobs", 4, "NaN", "nan"),  # NeMo RL's sampler scores every token: not "unscored"
        ("generation_logprobs", 2, "1e999", "inf"),
        ("advantages", 5, "Infinity", "inf"),
    ],
)
def test_a_non_finite_value_is_refused_at_its_line_and_place(
    tmp_path: Path, capsys: Any, key: str, token: int, value: str, shown: str
) -> None:
    lines = [json.dumps(line(-0.2 * (i + 1), 1.0 - i)) for i in range(3)]
    bad = json.loads(lines[1])
    bad[key][0][token] = "HERE"
    lines[1] = json.dumps(bad).replace('"HERE"', value)
    d = tmp_path / "dump"
    d.mkdir()
    (d / "train_data_step3.jsonl").write_text("\n".join(lines) + "\n")
    err = refused(capsys, tmp_path, d, f"train_data_step3.jsonl line 2: {key}[0][{token}]: expected a finite")
    assert err.rstrip().endswith(f"got {shown}")


def test_a_null_log_prob_is_refused(tmp_path: Path, capsys: Any) -> None:
    x = line(-0.2, 1.0)
    x["generation_logprobs"][0][2] = None
    refused(
        capsys, tmp_path, dump(tmp_path / "dump", [x]), "line 1: generation_logprobs[0][2]: expected a number, got null"
    )


def test_a_line_past_the_bound_is_refused_before_it_is_read(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3 GB line (sparse: no disk) is refused after reading the bound's bytes, not the line (before: read whole,
    28 s and 4.47 GB for 2 GB)."""
    monkeypatch.setattr(common, "MAX_LINE_BYTES", 1 << 20)
    d = dump(tmp_path / "dump", [line(-0.2, 1.0)])
    with (d / "train_data_step1.jsonl").open("ab") as f:
        f.write(b'{"prev_logprobs": [[')
        f.truncate(3 * 2**30)
    if (d / "train_data_step1.jsonl").stat().st_blocks * 512 > 2**28:
        pytest.skip("this file system has no sparse files")
    start = time.monotonic()
    refused(capsys, tmp_path, d, f"train_data_step1.jsonl line 2: expected a line of at most {1 << 20} bytes")
    assert time.monotonic() - start < 5.0


def test_a_file_past_the_bound_is_refused_before_it_is_read(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, nemo_dir: Path
) -> None:
    monkeypatch.setattr(common, "MAX_FILE_BYTES", 100)
    size = (nemo_dir / "train_data_step1.jsonl").stat().st_size
    refused(
        capsys, tmp_path, nemo_dir, f"train_data_step1.jsonl: expected a regular file of at most 100 bytes, got {size}"
    )


def test_no_grid_larger_than_the_dump_justifies(tmp_path: Path, capsys: Any) -> None:
    """3000 one-token samples and one of 20,000 tokens: 400 KB asking for a 3001 x 20000 grid (before: any size,
    a traceback once it did not fit)."""
    short = json.dumps(
        {
            k: [[0, -1]] if k != "token_loss_mask" else [[0, 1]]
            for k in ("prev_logprobs", "generation_logprobs", "token_loss_mask", "advantages")
        }
    )
    n = 20_000
    long = json.dumps(
        {
            "prev_logprobs": [[-1] * n],
            "generation_logprobs": [[-1] * n],
            "token_loss_mask": [[1] * n],
            "advantages": [[1] * n],
        }
    )
    d = tmp_path / "dump"
    d.mkdir()
    (d / "train_data_step1.jsonl").write_text("\n".join([short] * 3000 + [long]) + "\n")
    refused(capsys, tmp_path, d, "train_data_step1.jsonl: expected rows x longest row at most its")


def test_links_and_other_files_in_place_of_a_step_file_are_refused(tmp_path: Path, capsys: Any, nemo_dir: Path) -> None:
    outside = write(tmp_path / "elsewhere.jsonl", (nemo_dir / "train_data_step1.jsonl").read_text())
    os.symlink(outside, nemo_dir / "train_data_step2.jsonl")
    refused(capsys, tmp_path, nemo_dir, "train_data_step2.jsonl: expected a regular file of the dump, not a link")
    (nemo_dir / "train_data_step2.jsonl").unlink()
    (nemo_dir / "train_data_step2.jsonl").mkdir()
    refused(capsys, tmp_path, nemo_dir, "train_data_step2.jsonl: expected a regular file of the dump")


def test_every_setting_not_mapped_is_in_run_json(nemo_dir: Path, tmp_path: Path, capsys: Any) -> None:
    cfg = write(
        tmp_path / "c.json",
        json.dumps({"loss_fn": {"ratio_clip_max": 0.28, "my_clip": 1, "positive_example_nll_weight": 0.1}}),
    )
    code, _, err = run(capsys, "import", "nemo-rl", str(nemo_dir), str(tmp_path / "run"), "--config", str(cfg))
    assert code == 0, err
    imported = load_run(tmp_path / "run").info["imported"]
    assert imported["unsupported"]["my_clip"] == nemo_rl.UNREAD
    assert "positive_example_nll_weight" in imported["unsupported"] and "ratio_clip_max" in imported["mapped"]
