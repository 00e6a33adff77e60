"""LossConfig: every knob of the loss as a named, documented field; presets are data.

Each field is declared with ``_f(default, doc, group, **bounds)``: ``doc`` (one line, the UI's
tooltip), ``group`` (the control panel it belongs to) and its valid range (``ge``/``gt``/``le``
bounds, or ``choices``: a registry or a tuple of names). ``FIELDS`` reads that metadata and the
field's type once; it is the one table behind the dataclass checks, the API's request model
(app/schemas.py) and ``/api/v1/options``.
"""

from __future__ import annotations

import builtins
import dataclasses
import operator
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from grpo.advantages import ADVANTAGES
from grpo.aggregation import AGGREGATIONS
from grpo.errors import GrpoInputError
from grpo.kl import KL_ESTIMATORS
from grpo.objectives import OBJECTIVES
from grpo.registry import Registry

# One registry per independent choice, under the LossConfig field that picks from it.
REGISTRIES: dict[str, Registry[Any]] = {
    "advantage": ADVANTAGES,
    "objective": OBJECTIVES,
    "kl_estimator": KL_ESTIMATORS,
    "aggregation": AGGREGATIONS,
}
MAX_MAGNITUDE = 1e30  # numbers past this overflow float32 once multiplied by a ratio or an advantage
MAX_INT = 2**31 - 1
Choices = Registry[Any] | tuple[str, ...]


def _f(default: Any, doc: str, group: str, *, choices: Choices | None = None, **bounds: float) -> Any:
    meta: dict[str, Any] = {"doc": doc, "group": group, **bounds}
    if choices is not None:
        meta["choices"] = choices
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class LossConfig:
    """How to turn a batch into a GRPO-family loss. Defaults are the article's ``grpo_loss``."""

    preset: str | None = _f(None, "The preset these settings started from (display only).", "preset")

    # --- policy objective --------------------------------------------------------------------
    objective: str = _f(
        "clip", "Per-token policy objective (see the objective registry).", "policy", choices=OBJECTIVES
    )
    epsilon_low: float = _f(0.2, "Lower clip: the ratio is clipped below at 1 - epsilon_low.", "policy", ge=0.0)
    epsilon_high: float = _f(
        0.2,
        "Upper clip: 1 + epsilon_high (DAPO clip-higher); for CISPO with absolute bounds, the cap itself.",
        "policy",
        ge=0.0,
    )
    dual_clip: float | None = _f(
        None, "Dual-clip c (verl clip_ratio_c): for A < 0 the ratio is capped at c. None = off.", "policy", gt=1.0
    )
    delta: float | None = _f(
        None, "TRL's delta (INTELLECT-2): the unclipped ratio is capped at delta (> 1). None = off.", "policy", gt=1.0
    )
    cispo_bounds: str = _f(
        "absolute",
        "CISPO weight bounds: absolute = min(ratio, epsilon_high) (TRL); relative = "
        "clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) (verl).",
        "policy",
        choices=("absolute", "relative"),
    )
    sapo_temperature_pos: float = _f(1.0, "SAPO gate temperature for A > 0.", "policy", gt=0.0)
    sapo_temperature_neg: float = _f(1.05, "SAPO gate temperature for A <= 0.", "policy", gt=0.0)
    importance_sampling_level: str = _f(
        "token",
        "Ratio per token, or one per sequence: exp(mean log-ratio) (GSPO).",
        "policy",
        choices=("token", "sequence"),
    )
    log_ratio_clamp: float | None = _f(
        None, "Clamp the token log-ratio to [-c, c] before exp (verl: 20). None = off.", "policy", gt=0.0
    )
    seq_log_ratio_clamp: float | None = _f(
        None, "Upper clamp on the sequence log-ratio before exp (verl GSPO: 10). None = off.", "policy", gt=0.0
    )

    # --- KL penalty --------------------------------------------------------------------------
    beta: float = _f(0.01, "KL coefficient: loss += beta * KL (verl kl_loss_coef).", "kl", ge=0.0)
    kl_estimator: str = _f("k3", "Per-token estimator of KL(pi || pi_ref).", "kl", choices=KL_ESTIMATORS)
    kl_log_ratio_clamp: float | None = _f(
        None, "Clamp ref - logp to [-c, c] before the estimator (verl: 20). None = off.", "kl", gt=0.0
    )
    kl_clamp: float | None = _f(
        None,
        "Clamp the per-token KL to [-c, c] (verl low_var_kl: 10; here for any estimator). None = off.",
        "kl",
        gt=0.0,
    )
    kl_bias_correction: bool = _f(
        False, "Multiply the KL by the differentiable ratio (TRL use_bias_correction_kl).", "kl"
    )

    # --- aggregation -------------------------------------------------------------------------
    aggregation: str = _f(
        "seq-mean-token-mean", "How per-token losses become one scalar.", "aggregation", choices=AGGREGATIONS
    )
    max_completion_length: int | None = _f(
        None,
        "Dr. GRPO's constant divisor (seq-mean-token-sum-norm). None = the padded completion width.",
        "aggregation",
        ge=1,
    )
    skip_empty_rows: bool = _f(
        False, "Sequence means divide by rows with a token (verl) instead of all rows (TRL).", "aggregation"
    )
    length_epsilon: float = _f(
        0.0, "Added to each row's length in seq-mean-token-mean (verl: 1e-8).", "aggregation", ge=0.0
    )

    # --- the trainer's scaling: a captured micro-batch's loss exactly as the trainer returned it ---
    gradient_accumulation_steps: int = _f(
        1,
        "The trainer divides each micro-batch's loss by this before backward (TRL grpo, bnpo, dr_grpo, sapo, "
        "luspo: its gradient_accumulation_steps). 1 = the loss of the batch itself.",
        "scaling",
        ge=1,
    )
    token_normalizer: float | None = _f(
        None,
        "token-mean divides by this token count instead of the batch's own: TRL dapo/cispo "
        "num_items_in_batch / processes x GA / steps_per_generation; verl batch_num_tokens / dp_size. "
        "None = the batch's counted tokens.",
        "scaling",
        gt=0.0,
    )
    sequence_normalizer: float | None = _f(
        None,
        "Sequence means divide by this row count instead of the batch's (verl: global_batch_size / dp_size). "
        "None = the batch's rows.",
        "scaling",
        gt=0.0,
    )

    # --- advantages ----------------------------------------------------------------------------
    advantage: str = _f(
        "group", "Advantage from rewards (see the advantage registry).", "advantage", choices=ADVANTAGES
    )
    advantage_epsilon: float = _f(
        1e-5, "Added to the std: (R - mean) / (std + eps). Article 1e-5, TRL 1e-4, verl 1e-6.", "advantage", ge=0.0
    )

    # --- runtime -------------------------------------------------------------------------------
    dtype: str = _f("float32", "Compute dtype.", "runtime", choices=("float32", "float64"))
    device: str = _f(
        "auto", "Where to compute: auto (the input's device), cpu or cuda.", "runtime", choices=("auto", "cpu", "cuda")
    )

    def __post_init__(self) -> None:
        for spec in FIELDS:
            spec.check(getattr(self, spec.name))

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> LossConfig:
        """The preset's settings with ``overrides`` applied: ``from_preset("verl-grpo", beta=0.0)``."""
        if name not in PRESETS:
            raise GrpoInputError("preset", f"one of {', '.join(PRESETS)}", got=repr(name))
        unknown = sorted(set(overrides) - set(FIELD_NAMES))
        if unknown:
            raise GrpoInputError(unknown[0], f"a LossConfig field: one of {', '.join(FIELD_NAMES)}")
        return cls(**{**PRESETS[name].settings, "preset": name, **overrides})

    @classmethod
    def from_trl(cls, args: Any, strict: bool = False) -> LossConfig:
        """From a TRL 1.16 ``GRPOConfig`` (or a dict of its fields); see ``grpo.trainer_config.map_trl``.

        Settings GRPO Lens does not reproduce warn, or raise with ``strict``; none is dropped silently.
        """
        from grpo.trainer_config import from_trl

        return from_trl(args, strict=strict)

    @classmethod
    def from_verl(cls, actor_config: Any, algorithm: Any = None, strict: bool = False) -> LossConfig:
        """From verl 0.9.1's actor config (dict, OmegaConf or ActorConfig); see ``grpo.trainer_config.map_verl``."""
        from grpo.trainer_config import from_verl

        return from_verl(actor_config, algorithm, strict=strict)

    def replace(self, **changes: Any) -> LossConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


TYPES = {str: "string", float: "number", int: "integer", bool: "boolean"}
BOUNDS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<=")}


@dataclass(frozen=True)
class FieldSpec:
    """One LossConfig field as the checks, the request model and the page see it."""

    name: str
    type: str
    """string, number, integer or boolean."""
    python_type: builtins.type[Any]
    nullable: bool
    default: Any
    doc: str
    group: str
    bounds: dict[str, float]
    """ge / gt / le, from the field's metadata."""
    choices: Choices | None

    def choice_names(self) -> tuple[str, ...]:
        """The valid names now (a registry's grow as plugins register)."""
        choices = self.choices
        return choices.names() if isinstance(choices, Registry) else tuple(choices or ())

    def check(self, value: Any) -> None:
        """Raise GrpoInputError naming the field unless ``value`` has its type and range."""
        if self.choices is not None:
            if value not in self.choice_names():
                raise GrpoInputError(self.name, f"one of {', '.join(self.choice_names())}", got=repr(value))
            return
        if value is None:
            if not self.nullable:
                raise GrpoInputError(self.name, f"a value of type {self.python_type.__name__}", got="None")
            return
        if self.type == "string":
            if not isinstance(value, str):
                raise GrpoInputError(self.name, "a string", got=repr(value))
            return
        if self.type == "boolean":
            if not isinstance(value, bool):
                raise GrpoInputError(self.name, "true or false", got=repr(value))
            return
        if isinstance(value, bool) or not isinstance(value, int | float) or not abs(value) <= MAX_MAGNITUDE:
            # NaN fails the comparison too; the bound keeps every value finite in float32 arithmetic
            raise GrpoInputError(self.name, f"a finite number within ±{MAX_MAGNITUDE:g}", got=repr(value))
        if self.type == "integer" and not (float(value).is_integer() and value <= MAX_INT):
            raise GrpoInputError(self.name, f"an integer up to {MAX_INT}", got=repr(value))
        for bound, limit in self.bounds.items():
            holds, words = BOUNDS[bound]
            if not holds(value, limit):
                raise GrpoInputError(self.name, f"a number {words} {limit}", got=repr(value))

    def describe(self) -> dict[str, Any]:
        """What /api/v1/options lists for this field."""
        entry: dict[str, Any] = {
            "name": self.name,
            "doc": self.doc,
            "group": self.group,
            "default": self.default,
            "nullable": self.nullable,
            "type": "choice" if self.choices is not None else self.type,
        }
        if self.choices is not None:
            entry["choices"] = list(self.choice_names())
        return entry | self.bounds


def _spec(f: dataclasses.Field[Any], hint: Any) -> FieldSpec:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    base = next(a for a in args if a is not type(None))
    meta = f.metadata
    return FieldSpec(
        name=f.name,
        type=TYPES[base],
        python_type=base,
        nullable=type(None) in args,
        default=f.default,
        doc=meta["doc"],
        group=meta["group"],
        bounds={k: meta[k] for k in BOUNDS if k in meta},
        choices=meta.get("choices"),
    )


_HINTS = typing.get_type_hints(LossConfig)
FIELDS: tuple[FieldSpec, ...] = tuple(_spec(f, _HINTS[f.name]) for f in dataclasses.fields(LossConfig))
FIELD_NAMES: tuple[str, ...] = tuple(spec.name for spec in FIELDS)


@dataclass(frozen=True)
class Preset:
    """A named set of LossConfig choices, with what it reproduces and where that comes from."""

    name: str
    doc: str
    source: str
    settings: dict[str, Any]


# Reproduced from each library's defaults and recipes; see shared/reference/loss-variants-spec.md
# (TRL 1.16.0 §1.4-1.11, verl 0.9.1 §2.2-2.7). Fields not named keep LossConfig's defaults.
_TRL = {
    "beta": 0.0,  # GRPOConfig.beta default since PR #3516
    "epsilon_low": 0.2,
    "epsilon_high": 0.2,  # epsilon_high=None falls back to epsilon
    "advantage": "group",  # scale_rewards="group"
    "advantage_epsilon": 1e-4,  # TRL adds 1e-4 to the unbiased std
    "kl_estimator": "k3",
    "kl_bias_correction": True,  # use_bias_correction_kl defaults to True in 1.16.0
    "max_completion_length": 512,
    "skip_empty_rows": False,  # TRL divides sequence means by all rows
}
_VERL = {
    "epsilon_low": 0.2,
    "epsilon_high": 0.2,
    "dual_clip": 3.0,  # clip_ratio_c, always on in vanilla
    "log_ratio_clamp": 20.0,  # vanilla clamps ℓ - ℓold to ±20 before exp
    "beta": 0.0,  # use_kl_loss=False by default
    "kl_estimator": "k3",  # low_var_kl
    "kl_log_ratio_clamp": 20.0,  # low_var_kl clamps ref - logp to ±20 ...
    "kl_clamp": 10.0,  # ... and the estimate to ±10
    "advantage": "group",
    "advantage_epsilon": 1e-6,
    "skip_empty_rows": True,  # agg_loss's local fallback counts rows with a token
    "length_epsilon": 1e-8,  # seq-mean-token-mean divides by L_i + 1e-8
}

PRESETS: dict[str, Preset] = {}


def register_preset(preset: Preset) -> Preset:
    """Add a named preset (a plugin's, say): its settings must be valid LossConfig fields."""
    if preset.name in PRESETS:
        raise KeyError(f"preset {preset.name!r} is already registered")
    unknown = sorted(set(preset.settings) - set(FIELD_NAMES))
    if unknown:
        raise GrpoInputError(unknown[0], f"a LossConfig field: one of {', '.join(FIELD_NAMES)}")
    LossConfig(**preset.settings)  # every value checked now, not when the preset is first used
    PRESETS[preset.name] = preset
    return preset


for _preset in [
    Preset(
        "article",
        "The article's grpo_loss: clip 0.2, beta 0.01, k3, per-sequence token mean, eps 1e-5.",
        "shared/reference/grpo-loss-analysis.txt (grpo_loss.py)",
        {
            "objective": "clip",
            "epsilon_low": 0.2,
            "epsilon_high": 0.2,
            "beta": 0.01,
            "kl_estimator": "k3",
            "aggregation": "seq-mean-token-mean",
            "advantage": "group",
            "advantage_epsilon": 1e-5,
        },
    ),
    Preset(
        "trl-grpo",
        "TRL 1.16 GRPOTrainer, loss_type='grpo': per-sequence token mean, beta 0.",
        "TRL 1.16.0 GRPOConfig defaults with loss_type='grpo'",
        {**_TRL, "aggregation": "seq-mean-token-mean"},
    ),
    Preset(
        "trl-dapo",
        "TRL 1.16 default loss_type='dapo': token mean over the batch, beta 0.",
        "TRL 1.16.0 GRPOConfig defaults (loss_type='dapo')",
        {**_TRL, "aggregation": "token-mean"},
    ),
    Preset(
        "trl-dr_grpo",
        "TRL loss_type='dr_grpo': token sum / (rows x max_completion_length=512).",
        "TRL 1.16.0 GRPOConfig defaults with loss_type='dr_grpo' (TRL's recipe also sets "
        "scale_rewards='none', i.e. advantage='none')",
        {**_TRL, "aggregation": "seq-mean-token-sum-norm"},
    ),
    Preset(
        "trl-gspo",
        "TRL GSPO: loss_type='grpo' with importance_sampling_level='sequence', eps 3e-4/4e-4.",
        "TRL 1.16.0 docs (GSPO paper settings)",
        {
            **_TRL,
            "aggregation": "seq-mean-token-mean",
            "importance_sampling_level": "sequence",
            "epsilon_low": 3e-4,
            "epsilon_high": 4e-4,
        },
    ),
    Preset(
        "trl-cispo",
        "TRL loss_type='cispo': detached weight min(ratio, 5) times A times logp, token mean.",
        "TRL 1.16.0 docs (epsilon_high=5.0 recommended)",
        {
            **_TRL,
            "objective": "cispo",
            "cispo_bounds": "absolute",
            "epsilon_high": 5.0,
            "aggregation": "token-mean",
        },
    ),
    Preset(
        "trl-sapo",
        "TRL loss_type='sapo': soft sigmoid gate (temperatures 1.0 / 1.05), per-sequence mean.",
        "TRL 1.16.0 GRPOConfig defaults with loss_type='sapo'",
        {**_TRL, "objective": "sapo", "aggregation": "seq-mean-token-mean"},
    ),
    Preset(
        "verl-grpo",
        "verl 0.9.1 GRPO recipe: vanilla clip + dual clip 3, seq-mean-token-mean, low_var_kl 0.001.",
        "loss-variants-spec.md §2.7 (adv_estimator=grpo, use_kl_loss=True, kl_loss_coef=0.001)",
        {**_VERL, "aggregation": "seq-mean-token-mean", "beta": 0.001},
    ),
    Preset(
        "verl-dapo",
        "verl 0.9.1 DAPO recipe: token-mean, clip 0.2 / 0.28, dual clip 3, no KL.",
        "loss-variants-spec.md §2.7 (clip_ratio_high=0.28, use_kl_loss=False)",
        {**_VERL, "aggregation": "token-mean", "epsilon_high": 0.28},
    ),
    Preset(
        "verl-gspo",
        "verl 0.9.1 GSPO: sequence ratio (log clamped at 10), seq-mean-token-mean, 3e-4 / 4e-4.",
        "loss-variants-spec.md §2.3 gspo and §2.7",
        {
            **_VERL,
            "aggregation": "seq-mean-token-mean",
            "importance_sampling_level": "sequence",
            "epsilon_low": 3e-4,
            "epsilon_high": 4e-4,
            "dual_clip": None,
            "log_ratio_clamp": None,
            "seq_log_ratio_clamp": 10.0,
        },
    ),
]:
    register_preset(_preset)
