"""NeMo RL's config file, composed as its own loader does (``nemo_rl/utils/config.py``, NeMo RL 0.6.0, commit
7ea279a): ``defaults`` inheritance, ``_override_`` sections, OmegaConf interpolations, within bounds; and the
``loss_fn`` settings a config holds, whatever form it is given in."""

from __future__ import annotations

import functools
import json
import os
import re
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from grpo.errors import GrpoInputError

CONFIG_MAX_BYTES = 16 * 2**20
"""A config file (and each one it inherits) past this many bytes is refused before it is read."""
DEFAULTS_MAX_DEPTH = 64
"""How deep ``defaults`` may chain (a cycle is refused by name before that)."""
CONFIG_MAX_NODES = 1_000_000
"""Values one config file may hold once its YAML aliases are expanded (an alias bomb is refused, not expanded)."""
MISSING = "???"  # OmegaConf's mandatory value: a merge keeps the value it would replace
OVERRIDE = "_override_"  # NeMo RL's marker: this top-level section replaces the inherited one
# NeMo RL's register_omegaconf_resolvers(), which its run scripts call before resolving a config
RESOLVERS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}
# OmegaConf's YAML float (its _yaml.get_yaml_loader): 1e-6 is a float, as NeMo RL reads it (YAML 1.1 says a string)
YAML_FLOAT = re.compile(
    r"""^(?:
     [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A NeMo RL config file as its ``load_config`` composes it (``nemo_rl/utils/config.py`` at 7ea279a), as plain
    data: ``defaults`` (a path, or a list of paths, relative to the file's directory) are each composed the same way
    and merged in order, then the file itself; a top-level section holding ``_override_: true`` replaces the
    inherited one instead of merging into it; a ``???`` (OmegaConf's mandatory value) keeps the value it would
    replace; lists are replaced whole. The loss settings' ``${...}`` interpolations are resolved as NeMo RL's run
    scripts do (OmegaConf, with its resolvers add, mul, div, max) when OmegaConf is installed, else refused by name.
    ``.json`` is read as JSON, anything else as YAML the way OmegaConf reads it (needs PyYAML)."""
    return _resolved(_composed(Path(path), ()))


def _composed(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """``load_config_with_inheritance``: the file's defaults merged in order, then the file."""
    real = path.resolve()
    if real in chain:
        cycle = " -> ".join(p.name for p in (*chain, real))
        raise GrpoInputError("defaults", "a chain of config files without a cycle", got=cycle)
    if len(chain) >= DEFAULTS_MAX_DEPTH:
        raise GrpoInputError("defaults", f"at most {DEFAULTS_MAX_DEPTH} files deep", got=path.name)
    config = _config_file(path)
    if "defaults" not in config:
        return config
    parents = config.pop("defaults")
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or any(isinstance(p, dict | list) or p is None for p in parents):
        raise GrpoInputError("defaults", f"a path or a list of paths (in {path.name})", got=repr(parents)[:80])
    base: dict[str, Any] = {}
    for parent in map(str, parents):  # NeMo RL: each relative to the directory of the file that names it
        parent_path = Path(parent) if parent.startswith("/") else path.parent / parent
        base = _merge_with_override(base, _composed(parent_path, (*chain, real)))
    return _merge_with_override(base, config)


def _config_file(path: Path) -> dict[str, Any]:
    """One config file's mapping (OmegaConf.load: an empty file is {}), its aliases expanded within bounds."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > CONFIG_MAX_BYTES:
            raise GrpoInputError(path.name, f"a config file of at most {CONFIG_MAX_BYTES} bytes", got=f"{size} bytes")
        text = f.read().decode("utf-8", errors="replace")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise GrpoInputError(path.name, "valid JSON", got=str(exc)[:120]) from exc
    else:
        data = _yaml(text, path.name)
    data = {} if data is None else data
    if not isinstance(data, dict):  # NeMo RL asserts a DictConfig
        raise GrpoInputError("config", f"a mapping at the top of {path.name}", got=type(data).__name__)
    copied: dict[str, Any] = _copied(data, [CONFIG_MAX_NODES], path.name)
    return copied


def _copied(value: Any, budget: list[int], name: str) -> Any:
    """``value`` with every shared (aliased) part copied, counting the values against ``budget``."""
    budget[0] -= 1
    if budget[0] < 0:
        raise GrpoInputError(name, f"at most {CONFIG_MAX_NODES} values once its aliases are expanded", got="more")
    if isinstance(value, dict):
        return {k: _copied(v, budget, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_copied(v, budget, name) for v in value]
    return value


@functools.cache
def _yaml_loader() -> Any:
    import yaml  # optional: only a YAML config needs it

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when there, as OmegaConf's

    class Loader(base):  # type: ignore[misc,valid-type]
        """PyYAML's safe loader with OmegaConf's differences: its float, no timestamps, duplicate keys refused."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # << merges: their keys may be repeated
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, str | int | float | bool):
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"found duplicate key {key}", key_node.start_mark
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", YAML_FLOAT, list("-+0123456789."))
    Loader.yaml_implicit_resolvers = {
        key: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for key, resolvers in Loader.yaml_implicit_resolvers.items()
    }
    return Loader


def _yaml(text: str, name: str) -> Any:
    try:
        import yaml
    except ImportError as exc:
        raise GrpoInputError(name, "a JSON config (.json): PyYAML is not installed to read YAML") from exc
    try:
        return yaml.load(text, Loader=_yaml_loader())  # a SafeLoader
    except (yaml.YAMLError, RecursionError) as exc:
        raise GrpoInputError(name, "valid YAML", got=str(exc).splitlines()[0][:120]) from exc


def _merge_with_override(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """NeMo RL's ``merge_with_override``: a top-level section of ``override`` marked ``_override_: true`` (the marker
    removed) replaces ``base``'s instead of merging into it; then OmegaConf's merge."""
    base = dict(base)
    for key, value in override.items():
        if value != MISSING and isinstance(value, dict) and value.get(OVERRIDE, False):
            value.pop(OVERRIDE)
            base.pop(key, None)
    return _merge(base, override)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``OmegaConf.merge`` of two plain configs: mappings merge key by key, ``???`` keeps the value it would replace,
    anything else (a list, a scalar, null, an interpolation) replaces; a list over a mapping or the reverse is an
    error there (refused here, naming the key)."""
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        if value == MISSING and key in out:
            continue
        if isinstance(value, dict) and isinstance(old, dict):
            out[key] = _merge(old, value)
        elif (isinstance(value, dict) and isinstance(old, list)) or (isinstance(value, list) and isinstance(old, dict)):
            raise GrpoInputError(
                str(key),
                "the same kind of value as the config it inherits (OmegaConf cannot merge a list with a mapping)",
                got=type(value).__name__,
            )
        else:
            out[key] = value
    return out


def _interpolations(value: Any, path: str) -> list[tuple[str, str]]:
    """(dotted key, value) of every string holding ``${`` in ``value``."""
    if isinstance(value, str):
        return [(path, value)] if "${" in value else []
    if isinstance(value, dict):
        return [hit for k, v in value.items() for hit in _interpolations(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in _interpolations(v, f"{path}[{i}]")]
    return []


def _resolved(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its ``loss_fn`` section's interpolations resolved through OmegaConf (its run scripts'
    ``OmegaConf.to_container(config, resolve=True)``, NeMo RL's resolvers registered for the call and removed after),
    or refused by name when OmegaConf is not installed or a value does not resolve. Other sections' stay as written:
    the import reads only ``loss_fn``."""
    needs = _interpolations(config.get("loss_fn"), "loss_fn")
    if not needs:
        return config
    key, value = needs[0]
    try:
        from omegaconf import OmegaConf
    except ImportError:
        raise GrpoInputError(
            key,
            "a value: NeMo RL resolves this interpolation with OmegaConf, not installed here (pip install "
            "omegaconf, NeMo RL's own dependency, resolves it)",
            got=repr(value)[:80],
        ) from None
    added = [name for name in RESOLVERS if not OmegaConf.has_resolver(name)]
    with warnings.catch_warnings():  # OmegaConf 2.4 calls its register_new_resolver (NeMo RL's call) deprecated
        warnings.simplefilter("ignore", UserWarning)
        for name in added:
            OmegaConf.register_new_resolver(name, RESOLVERS[name])
    try:
        loss = OmegaConf.to_container(OmegaConf.create(config).loss_fn, resolve=True)
    except Exception as exc:  # OmegaConf's many errors: each a value that does not resolve
        raise GrpoInputError(
            key,
            "an interpolation that resolves (NeMo RL resolves it with OmegaConf)",
            got=f"{value!r}: {str(exc).splitlines()[0]}"[:160],
        ) from exc
    finally:
        for name in added:
            OmegaConf.clear_resolver(name)
    return config | {"loss_fn": loss}


def loss_fn_fields(cfg: Any) -> dict[str, Any]:
    """The ``loss_fn`` settings ``cfg`` holds (a mapping, a pydantic model, a whole master config or a config
    file's path), as a plain dict of resolved values; a GrpoInputError naming a section it cannot read."""
    if cfg is None:
        return {}
    if isinstance(cfg, str | os.PathLike):
        cfg = read_config(cfg)
    if hasattr(cfg, "model_dump"):  # NeMo RL's pydantic ClippedPGLossConfig
        cfg = cfg.model_dump()
    if not isinstance(cfg, Mapping):
        raise GrpoInputError("config", "NeMo RL's loss_fn settings: a mapping", got=type(cfg).__name__)
    if "defaults" in cfg:  # inheritance needs the file's directory: read_config composes it
        raise GrpoInputError(
            "defaults",
            "a config read from its file (--config FILE, or read_config), which NeMo RL's loader "
            "composes relative to it",
            got=repr(cfg["defaults"])[:80],
        )
    section = "loss_fn." if "loss_fn" in cfg else ""
    if "loss_fn" in cfg:  # the whole master config
        if not isinstance(cfg["loss_fn"], Mapping):
            raise GrpoInputError("loss_fn", "a mapping of ClippedPGLossConfig's fields", got=repr(cfg["loss_fn"])[:80])
        cfg = cfg["loss_fn"]
    out = {str(k): v for k, v in cfg.items() if k != OVERRIDE}  # a root file's own marker stays in NeMo RL (unread)
    for name, value in out.items():
        if value == MISSING:
            raise GrpoInputError(f"{section}{name}", "a value (??? is mandatory: no file or override gave it)")
        if hits := _interpolations(value, f"{section}{name}"):
            raise GrpoInputError(
                hits[0][0],
                "a value: resolve the interpolation (read_config does, with OmegaConf)",
                got=repr(hits[0][1])[:80],
            )
    return out
