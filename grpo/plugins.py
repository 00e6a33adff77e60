"""Plugins: modules that register variants and presets without editing GRPO Lens.

``GRPO_LENS_PLUGINS=my_pkg.my_objective,other_module`` makes ``import grpo`` import each module
after the built-in registries and presets exist. A plugin registers with the registries'
decorators (``@grpo.OBJECTIVES.register("name", label=..., axis=..., settings=(Setting(...),))``,
``@CORRECTIONS.register("mode", label=..., level="token", action="truncate")``) and adds presets with
``grpo.register_preset(grpo.Preset(...))``; LossConfig (its field table grows with the declared
settings), evaluate, the API, the CLI's ``--set``, the API's options and the page's controls then offer
them. Importing a module the user named is the only effect.
"""

from __future__ import annotations

import importlib
import os

PLUGINS_VARIABLE = "GRPO_LENS_PLUGINS"
_loaded: list[str] = []


def load_plugins(names: str | None = None) -> list[str]:
    """Import the comma-separated modules in ``names`` (default: $GRPO_LENS_PLUGINS) once each;
    returns the modules imported so far."""
    for name in (names if names is not None else os.environ.get(PLUGINS_VARIABLE, "")).split(","):
        name = name.strip()
        if name and name not in _loaded:
            importlib.import_module(name)
            _loaded.append(name)
    return list(_loaded)
