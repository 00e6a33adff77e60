"""``GET /api/v1/options``: everything the page builds its controls from, read off grpo."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import grpo
from grpo.examples import SCENARIOS
from grpo.glossary import GLOSSARY


@lru_cache
def options_json() -> dict[str, Any]:
    return {
        "fields": [spec.describe() for spec in grpo.FIELDS],
        "registries": {kind: [e.describe() for e in reg.entries()] for kind, reg in grpo.REGISTRIES.items()},
        "presets": [
            {"name": p.name, "doc": p.doc, "source": p.source, "config": grpo.LossConfig.from_preset(p.name).to_dict()}
            for p in grpo.PRESETS.values()
        ],
        "regions": list(grpo.REGIONS),
        "scenarios": [dataclasses.asdict(s) for s in SCENARIOS.values()],
        "glossary": [dataclasses.asdict(g) for g in GLOSSARY],
    }
