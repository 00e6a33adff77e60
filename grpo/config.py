"""LossConfig: every knob of the loss as a named, documented field; presets are data.

Each field is declared with ``_setting(default, doc, group, **bounds)``: ``doc`` (one line, the UI's
tooltip), ``group`` (the control panel it belongs to) and its valid range (``ge``/``gt``/``le``
bounds, or ``choices``: a registry or a tuple of names). ``FIELDS`` reads that metadata and the
field's type once; it is the one table behind the dataclass checks, the API's request model
(app/schemas.py) and ``/api/v1/options``.

The presets (``PRESETS``, built whole by ``grpo.presets``) and trainers' configs (read by
``grpo.trainer_fields``) arrive as plain settings; ``from_preset``, ``resolve``, ``from_trl`` and
``from_verl`` turn them into a checked LossConfig, so neither of those modules imports this one.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

from grpo.advantages import ADVANTAGES
from grpo.aggregation import AGGREGATIONS
from grpo.corrections import CORRECTIONS, rs_criteria
from grpo.errors import GrpoInputError
from grpo.kl import KL_ESTIMATORS
from grpo.objectives import OBJECTIVES
from grpo.presets import PRESETS as PRESETS
from grpo.presets import Preset as Preset
from grpo.registry import BOUNDS, TYPES, Choices, FieldSpec, Registry, Setting, Table, setting_spec
from grpo.registry import MAX_INT as MAX_INT
from grpo.registry import MAX_MAGNITUDE as MAX_MAGNITUDE
from grpo.trainer_fields import TrainerFields, checked, trl_fields, verl_fields

# One registry per independent choice, under the LossConfig field that picks from it.
REGISTRIES: dict[str, Registry[Any]] = {
    "advantage": ADVANTAGES,
    "objective": OBJECTIVES,
    "kl_estimator": KL_ESTIMATORS,
    "aggregation": AGGREGATIONS,
}


def _setting(default: Any, doc: str, group: str, *, choices: Choices | None = None, **bounds: float) -> Any:
    meta: dict[str, Any] = {"doc": doc, "group": group, **bounds}
    if choices is not None:
        meta["choices"] = choices
    return field(default=default, metadata=meta)


def declared_settings() -> Iterator[Setting]:
    """The settings the variants declare in their registrations (a plugin's included), first one of a name first."""
    seen: set[str] = set()
    for registry in (*REGISTRIES.values(), CORRECTIONS):
        for setting in registry.settings():
            if setting.name not in seen:
                seen.add(setting.name)
                yield setting


def _declared(name: str) -> Any:
    """The LossConfig field of a setting a built-in variant declares: its default, doc, group and bounds."""
    setting = next(s for s in declared_settings() if s.name == name)
    meta: dict[str, Any] = {"doc": setting.doc, "group": setting.group, "setting": setting, **setting.bounds()}
    if setting.choices is not None:
        meta["choices"] = setting.choices
    return field(default=setting.default, metadata=meta)


@dataclass(frozen=True)
class LossConfig:
    """How to turn a batch into a GRPO-family loss. Defaults are the article's ``grpo_loss``."""

    preset: str | None = _setting(None, "The preset these settings started from (display only).", "preset")

    # --- policy objective --------------------------------------------------------------------
    objective: str = _setting(
        "clip", "Per-token policy objective (see the objective registry).", "policy", choices=OBJECTIVES
    )
    epsilon_low: float = _setting(
        0.2,
        "Lower clip: the ratio is clipped below at 1 - epsilon_low (geo_mean: the log-ratio at -epsilon_low; "
        "dppo: the divergence threshold of A < 0 tokens).",
        "policy",
        ge=0.0,
    )
    epsilon_high: float = _setting(
        0.2,
        "Upper clip: 1 + epsilon_high (DAPO clip-higher); for CISPO with absolute bounds, the cap itself; "
        "geo_mean: the log-ratio at epsilon_high; dppo: the divergence threshold of A > 0 tokens.",
        "policy",
        ge=0.0,
    )
    dual_clip: float | None = _setting(
        None,
        "Dual-clip c (verl clip_ratio_c): for A < 0 the ratio is capped at c (dppo: every token's detached "
        "weight is truncated at c). None = off.",
        "policy",
        gt=1.0,
    )
    delta: float | None = _setting(
        None, "TRL's delta (INTELLECT-2): the unclipped ratio is capped at delta (> 1). None = off.", "policy", gt=1.0
    )
    cispo_bounds: str = _declared("cispo_bounds")
    sapo_temperature_pos: float = _declared("sapo_temperature_pos")
    sapo_temperature_neg: float = _declared("sapo_temperature_neg")
    importance_sampling_level: str = _setting(
        "token",
        "Ratio per token, or one per sequence: exp(mean log-ratio) (GSPO).",
        "policy",
        choices=("token", "sequence"),
    )
    sequence_ratio_gradient: str = _setting(
        "mean",
        "At sequence level (GSPO), how the row's ratio s passes the gradient: mean = through the mean log-ratio "
        "(TRL: each token gets its row's weighted mean advantage); token = verl's sg(s)·pi/sg(pi) (each token its "
        "own advantage). The same for one advantage per row; they differ when advantages come per token.",
        "policy",
        choices=("mean", "token"),
    )
    top_entropy_quantile: float = _setting(
        1.0,
        "TRL's high-entropy mask (the 80/20 paper): the policy term acts only on tokens whose entropy is at "
        "least the (1 - q) quantile of the counted tokens' entropies; the KL still counts. 1 = every token. "
        "Needs the batch's entropies.",
        "policy",
        gt=0.0,
        le=1.0,
    )
    vespo_k_pos: float = _declared("vespo_k_pos")
    vespo_lambda_pos: float = _declared("vespo_lambda_pos")
    vespo_k_neg: float = _declared("vespo_k_neg")
    vespo_lambda_neg: float = _declared("vespo_lambda_neg")
    clip_cov_ratio: float = _declared("clip_cov_ratio")
    clip_cov_lb: float = _declared("clip_cov_lb")
    clip_cov_ub: float = _declared("clip_cov_ub")
    clip_cov_seed: int = _declared("clip_cov_seed")
    kl_cov_ratio: float = _declared("kl_cov_ratio")
    ppo_kl_coef: float = _declared("ppo_kl_coef")
    dro_beta: float | None = _declared("dro_beta")
    log_ratio_clamp: float | None = _setting(
        None, "Clamp the token log-ratio to [-c, c] before exp (verl: 20). None = off.", "policy", gt=0.0
    )
    seq_log_ratio_clamp: float | None = _setting(
        None, "Upper clamp on the sequence log-ratio before exp (verl GSPO: 10). None = off.", "policy", gt=0.0
    )

    # --- rollout correction (off-policy: the sampler's log-probs, grpo.corrections) -----------------
    rollout_correction: str = _setting(
        "none",
        "How the sampler's log-probs (sampling_per_token_logps) reweight the policy term: TRL's "
        "vllm_importance_sampling_mode (token or sequence, truncate or mask). none = off.",
        "policy",
        choices=CORRECTIONS,
    )
    rollout_is_min: float | None = _setting(
        None,
        "Lower bound C_min of the rollout IS weight: truncate clamps to it, mask zeroes below it "
        "(TRL vllm_importance_sampling_clip_min). None = no lower bound.",
        "policy",
        ge=0.0,
    )
    rollout_is_max: float | None = _setting(
        3.0,
        "Upper bound C_max of the rollout IS weight: truncate clamps to it, mask zeroes above it "
        "(TRL vllm_importance_sampling_clip_max, default 3). None = no upper bound.",
        "policy",
        gt=0.0,
    )
    rollout_is_log_ratio_clamp: float | None = _setting(
        None,
        "Clamp old - sampler (per token, or the row's sum at sequence level) to [-c, c] before exp "
        "(verl: 20, its SAFETY_BOUND). None = off (TRL).",
        "policy",
        gt=0.0,
    )
    rollout_is_batch_normalize: bool = _setting(
        False,
        "Divide the rollout IS weights by their batch mean, over counted tokens (token level) or non-empty "
        "rows (sequence level), when it is above 1e-8 (verl rollout_is_batch_normalize).",
        "policy",
    )
    rollout_is_normalizer: float | None = _setting(
        None,
        "The batch mean verl divided the IS weights by, computed on the driver over the whole batch (a "
        "micro-batch cannot recompute it; set by a capture). None = this batch's own mean.",
        "policy",
        gt=0.0,
    )
    rollout_rs: str | None = _setting(
        None,
        "verl's rejection (rollout_rs): comma-chained criteria among token_k1..3, seq_sum_k1..3, seq_mean_k1..3, "
        "seq_max_k2..3 on old - sampler; a rejected token leaves the batch (policy, KL, counts). None = off.",
        "policy",
    )
    rollout_rs_threshold: str | None = _setting(
        None,
        "Thresholds of rollout_rs: one for all or one per criterion, comma-separated; k1 takes 'lower_upper' "
        "bounds on -log r = sampler - old (or an upper, its inverse the lower), the others an upper bound.",
        "policy",
    )
    rollout_bypass: bool = _setting(
        False,
        "verl's bypass mode: the sampler's log-probs stand in for the old policy, and the IS weights and the "
        "rejection compare the current policy with the sampler (ppo_clip: clip only; reinforce: gpg x weights).",
        "policy",
    )
    off_policy_mask_threshold: float | None = _setting(
        None,
        "DeepSeek-V3.2's off-policy sequence mask (TRL): drop the policy term of rows with A < 0 whose mean "
        "sampler (else old) minus current log-prob is above this. None = off.",
        "policy",
    )

    # --- KL penalty --------------------------------------------------------------------------
    beta: float = _setting(0.01, "KL coefficient: loss += beta * KL (verl kl_loss_coef).", "kl", ge=0.0)
    kl_estimator: str = _setting("k3", "Per-token estimator of KL(pi || pi_ref).", "kl", choices=KL_ESTIMATORS)
    kl_log_ratio_clamp: float | None = _setting(
        None, "Clamp ref - logp to [-c, c] before the estimator (verl: 20). None = off.", "kl", gt=0.0
    )
    kl_clamp: float | None = _setting(
        None,
        "Clamp the per-token KL to [-c, c] (verl low_var_kl: 10; here for any estimator). None = off.",
        "kl",
        gt=0.0,
    )
    kl_bias_correction: bool = _setting(
        False, "Multiply the KL by the differentiable ratio (TRL use_bias_correction_kl).", "kl"
    )
    kl_gradient: str = _setting(
        "estimator",
        "The KL term's gradient: the estimator's own, or k2's (logp - ref) under the estimator's value "
        "(verl's straight-through '+' types: k1+, k3+, abs+).",
        "kl",
        choices=("estimator", "k2"),
    )

    # --- entropy bonus --------------------------------------------------------------------------
    entropy_coef: float = _setting(
        0.0,
        "Entropy bonus: loss -= entropy_coef · mean entropy (TRL entropy_coef, the coefficient the step applied "
        "when use_adaptive_entropy; verl entropy_coeff). Needs the batch's entropies; they carry no gradient "
        "here (they come from the logits, not the chosen tokens' log-probs). 0 = off.",
        "policy",
        ge=0.0,
    )
    entropy_weighting: str = _setting(
        "tokens",
        "How the entropies are averaged: tokens = TRL's mean over the counted tokens the policy term acts on "
        "(the entropy mask's), divided by entropy_accumulation_steps; aggregation = verl's agg_loss with the "
        "loss's aggregation weights.",
        "policy",
        choices=("tokens", "aggregation"),
    )

    # --- aggregation -------------------------------------------------------------------------
    aggregation: str = _setting(
        "seq-mean-token-mean", "How per-token losses become one scalar.", "aggregation", choices=AGGREGATIONS
    )
    max_completion_length: int | None = _setting(
        None,
        "Dr. GRPO's constant divisor (seq-mean-token-sum-norm). None = the padded completion width.",
        "aggregation",
        ge=1,
    )
    skip_empty_rows: bool = _setting(
        False, "Sequence means divide by rows with a token (verl) instead of all rows (TRL).", "aggregation"
    )
    length_epsilon: float = _setting(
        0.0, "Added to each row's length in seq-mean-token-mean (verl: 1e-8).", "aggregation", ge=0.0
    )

    # --- the trainer's scaling: a captured micro-batch's loss exactly as the trainer returned it ---
    gradient_accumulation_steps: int = _setting(
        1,
        "The trainer divides each micro-batch's loss by this before backward (TRL grpo, bnpo, dr_grpo, sapo, "
        "luspo: its gradient_accumulation_steps). 1 = the loss of the batch itself.",
        "scaling",
        ge=1,
    )
    entropy_accumulation_steps: int = _setting(
        1,
        "TRL divides the entropy bonus and the MoE router loss by its gradient_accumulation_steps for every loss "
        "type (dapo, cispo and vespo included, whose policy term takes it through token_normalizer). "
        "1 = undivided.",
        "scaling",
        ge=1,
    )
    aux_loss_coef: float = _setting(
        0.0,
        "MoE load balancing: loss += aux_loss_coef · aux_loss / entropy_accumulation_steps (TRL's "
        "router_aux_loss_coef, or the model's own when that is None). 0 = off.",
        "scaling",
        ge=0.0,
    )
    aux_loss: float | None = _setting(
        None,
        "The router's load-balancing loss the model returned for this micro-batch: captured, since it comes from "
        "the router's logits and cannot be recomputed from log-probs. Needed when aux_loss_coef > 0.",
        "scaling",
    )
    token_normalizer: float | None = _setting(
        None,
        "token-mean divides by this token count instead of the batch's own: TRL dapo/cispo "
        "num_items_in_batch / processes x GA / steps_per_generation; verl batch_num_tokens / dp_size. "
        "None = the batch's counted tokens.",
        "scaling",
        gt=0.0,
    )
    sequence_normalizer: float | None = _setting(
        None,
        "Sequence means divide by this row count instead of the batch's (verl: global_batch_size / dp_size). "
        "None = the batch's rows.",
        "scaling",
        gt=0.0,
    )

    # --- advantages ----------------------------------------------------------------------------
    advantage: str = _setting(
        "group", "Advantage from rewards (see the advantage registry).", "advantage", choices=ADVANTAGES
    )
    advantage_epsilon: float = _setting(
        1e-5, "Added to the std: (R - mean) / (std + eps). Article 1e-5, TRL 1e-4, verl 1e-6.", "advantage", ge=0.0
    )
    gamma: float = _setting(
        1.0,
        "The discount of a per-token return γ^k·R (verl algorithm.gamma; the reinforce-pp advantage reads it).",
        "advantage",
        ge=0.0,
        le=1.0,
    )

    # --- runtime -------------------------------------------------------------------------------
    dtype: str = _setting("float32", "Compute dtype.", "runtime", choices=("float32", "float64"))
    device: str = _setting(
        "auto", "Where to compute: auto (the input's device), cpu or cuda.", "runtime", choices=("auto", "cpu", "cuda")
    )
    plugin_settings: InitVar[tuple[tuple[str, Any], ...]] = ()
    """The values of the settings plugins' variants declare, as (name, value) pairs: given by name (resolve,
    from_preset, replace), read as attributes (a setting not given has its declared default). Not a field:
    LossConfig's fields are its own settings; equality, hashing, replace and to_dict include these."""

    def __post_init__(self, plugin_settings: tuple[tuple[str, Any], ...]) -> None:
        for spec in OWN_FIELDS:
            spec.check(getattr(self, spec.name))
        object.__setattr__(self, "plugin_settings", _checked_plugin_settings(plugin_settings))
        if self.rollout_rs is not None:  # the criteria and their thresholds, checked once here
            rs_criteria(self.rollout_rs, self.rollout_rs_threshold)
        low, high = self.rollout_is_min, self.rollout_is_max
        if low is not None and high is not None and low > high:
            raise GrpoInputError("rollout_is_min", f"a number <= rollout_is_max ({high})", got=repr(low))

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> LossConfig:
        """The preset's settings with ``overrides`` applied: ``from_preset("verl-grpo", beta=0.0)``."""
        if not isinstance(name, str) or name not in PRESETS:
            raise GrpoInputError("preset", f"one of {', '.join(PRESETS)}", got=repr(name)[:80])
        unknown = sorted(set(overrides) - set(FIELD_NAMES))
        if unknown:
            raise GrpoInputError(unknown[0], f"a LossConfig field: one of {', '.join(FIELD_NAMES)}")
        return cls(**_routed({**PRESETS[name].settings, "preset": name, **overrides}))

    @classmethod
    def resolve(
        cls,
        fields: Mapping[str, Any] | None = None,
        base: LossConfig | None = None,
        keep: Iterable[str] = (),
        device: str | None = None,
    ) -> LossConfig:
        """The one way settings become a LossConfig (the API, the lab, the CLI, runs and their checks).

        ``fields`` is a preset and overrides, ``{"preset": "verl-grpo", "beta": 0.0}``. Without a preset the
        overrides apply to ``base`` (a stored run's config), else to the article's preset. When a preset
        replaces ``base``, the fields named in ``keep`` stay ``base``'s unless given (a run's trainer
        scaling). ``device`` is where a config left at ``auto`` runs (the caller's policy); None leaves it.
        """
        if fields is not None and not isinstance(fields, Mapping):
            raise GrpoInputError("config", "a JSON object: a preset and LossConfig fields", got=type(fields).__name__)
        given = dict(fields or {})
        preset = given.pop("preset", None)
        unknown = sorted(set(given) - set(FIELD_NAMES))
        if unknown:
            raise GrpoInputError(unknown[0], f"a LossConfig field: one of {', '.join(FIELD_NAMES)}")
        if preset is None and base is not None:
            config = base.replace(**given)
        else:
            config = cls.from_preset("article" if preset is None else preset, **given)
            if base is not None:
                config = dataclasses.replace(config, **{k: getattr(base, k) for k in keep if k not in given})
        if device is not None and config.device == "auto":
            config = dataclasses.replace(config, device=device)
        return config

    @classmethod
    def from_trl(cls, args: Any, strict: bool = False) -> LossConfig:
        """From a TRL 1.16 ``GRPOConfig`` (or a dict of its fields); see ``grpo.trainer_config.map_trl``.

        Settings GRPO Lens does not reproduce warn, or raise with ``strict``; none is dropped silently.
        """
        return cls.from_trainer_fields(checked(trl_fields(args), strict, "TRL"))

    @classmethod
    def from_verl(cls, actor_config: Any, algorithm: Any = None, strict: bool = False) -> LossConfig:
        """From verl 0.9.1's actor config (dict, OmegaConf or ActorConfig); see ``grpo.trainer_config.map_verl``."""
        return cls.from_trainer_fields(checked(verl_fields(actor_config, algorithm), strict, "verl"))

    @classmethod
    def from_trainer_fields(cls, found: TrainerFields) -> LossConfig:
        """A trainer config's settings (``grpo.trainer_fields``), labelled with its recipe's preset if there is one."""
        return cls(**found.settings, preset=found.recipe if found.recipe in PRESETS else None)

    def replace(self, **changes: Any) -> LossConfig:
        """A copy with ``changes`` (LossConfig fields or plugins' settings, by name)."""
        return dataclasses.replace(self, **_routed(changes, self._plugin_values()))

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, a plugin's settings among them (what ``resolve`` takes back)."""
        given = dict(self._plugin_values())
        return dataclasses.asdict(self) | {name: given.get(name, spec.default) for name, spec in PLUGIN_FIELDS.items()}

    def _plugin_values(self) -> tuple[tuple[str, Any], ...]:
        values: tuple[tuple[str, Any], ...] = self.__dict__.get("plugin_settings", ())
        return values

    def _key(self) -> tuple[Any, ...]:
        return (_FIELD_VALUES(self), self.__dict__.get("plugin_settings", ()))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, LossConfig)
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    if not TYPE_CHECKING:  # a plugin's objective reads its setting as config.<name>; typed code reads fields

        def __getattr__(self, name: str) -> Any:
            spec = PLUGIN_FIELDS.get(name)
            if spec is None:
                raise AttributeError(f"'LossConfig' object has no attribute {name!r}")
            return dict(self._plugin_values()).get(name, spec.default)


def _spec(f: dataclasses.Field[Any], hint: Any) -> FieldSpec:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    base = next(a for a in args if a is not type(None))
    meta = f.metadata
    spec = FieldSpec(
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
    declared = meta.get("setting")
    if declared is None:
        return spec
    if (declared.type, declared.nullable) != (base, spec.nullable):
        raise TypeError(f"LossConfig.{f.name} is typed {hint}, its declaration {declared.type.__name__}")
    return dataclasses.replace(spec, trl=declared.trl, verl=declared.verl)


_HINTS = typing.get_type_hints(LossConfig)
OWN_FIELDS: tuple[FieldSpec, ...] = tuple(_spec(f, _HINTS[f.name]) for f in dataclasses.fields(LossConfig))
_OWN_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(LossConfig))
_FIELD_VALUES = operator.attrgetter(*_OWN_NAMES)  # the fields' values as one tuple, in C (hashing, equality)


class PluginFields(Mapping[str, FieldSpec]):
    """The settings plugins' variants declare that LossConfig has no field of, by name; read afresh when a
    registry has grown (a plugin registers after this module is imported)."""

    def __init__(self) -> None:
        self._seen = -1
        self._specs: dict[str, FieldSpec] = {}

    def current(self) -> dict[str, FieldSpec]:
        """The table now (read again only when something was registered since)."""
        if Registry.registrations != self._seen:
            found = (setting_spec(s) for s in declared_settings() if s.name not in _OWN_NAMES)
            self._specs, self._seen = {spec.name: spec for spec in found}, Registry.registrations
        return self._specs

    def __getitem__(self, name: str) -> FieldSpec:
        return self.current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.current())

    def __len__(self) -> int:
        return len(self.current())


PLUGIN_FIELDS = PluginFields()


FIELDS: Sequence[FieldSpec] = Table(lambda: (*OWN_FIELDS, *PLUGIN_FIELDS.values()))
"""Every setting: LossConfig's fields, then the settings plugins declare (what the checks, the API's request
model, the CLI and /api/v1/options read)."""
FIELD_NAMES: Sequence[str] = Table(lambda: (*_OWN_NAMES, *PLUGIN_FIELDS))


def _routed(changes: Mapping[str, Any], current: tuple[tuple[str, Any], ...] = ()) -> dict[str, Any]:
    """``changes`` with the plugins' settings among them gathered into plugin_settings, over ``current``."""
    declared = PLUGIN_FIELDS.current()
    if not declared:
        return dict(changes)
    own = {k: v for k, v in changes.items() if k not in declared}
    plugin = {k: v for k, v in changes.items() if k in declared}
    if plugin:
        before = own.get("plugin_settings", current)
        own["plugin_settings"] = tuple({**dict(_checked_plugin_settings(before)), **plugin}.items())
    return own


def _checked_plugin_settings(pairs: Any) -> tuple[tuple[str, Any], ...]:
    """``pairs`` sorted by name, once each name is a plugin's declared setting and each value in its range."""
    if pairs == ():
        return ()
    expected = "(name, value) pairs of the settings plugins declare"
    if not isinstance(pairs, tuple | list) or not all(isinstance(p, tuple | list) and len(p) == 2 for p in pairs):
        raise GrpoInputError("plugin_settings", expected, got=repr(pairs)[:80])
    checked_pairs = {}
    for name, value in pairs:
        if name not in PLUGIN_FIELDS:
            raise GrpoInputError("plugin_settings", f"{expected}: one of {', '.join(PLUGIN_FIELDS)}", got=repr(name))
        PLUGIN_FIELDS[name].check(value)
        checked_pairs[name] = value
    return tuple(sorted(checked_pairs.items()))


def _check_preset(preset: Preset) -> Preset:
    """``preset`` when its settings are LossConfig fields with valid values, else GrpoInputError naming one."""
    unknown = sorted(set(preset.settings) - set(FIELD_NAMES))
    if unknown:
        raise GrpoInputError(unknown[0], f"a LossConfig field: one of {', '.join(FIELD_NAMES)}")
    LossConfig(**preset.settings)  # every value checked now, not when the preset is first used
    return preset


def register_preset(preset: Preset) -> Preset:
    """Add a named preset (a plugin's, say): its settings must be valid LossConfig fields."""
    if preset.name in PRESETS:
        raise KeyError(f"preset {preset.name!r} is already registered")
    PRESETS[preset.name] = _check_preset(preset)
    return preset


for _built_in in PRESETS.values():
    _check_preset(_built_in)
