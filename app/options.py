"""``GET /api/v1/options``: everything the page builds its controls from, read off grpo."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import grpo
from grpo.config import CHOICES
from grpo.examples import SCENARIOS
from grpo.glossary import GLOSSARY
from grpo.registry import Registry


def _field(f: dataclasses.Field[Any]) -> dict[str, Any]:
    kind = str(f.type)
    entry: dict[str, Any] = {
        "name": f.name,
        "doc": f.metadata.get("doc", ""),
        "group": f.metadata.get("group", ""),
        "default": f.default,
        "nullable": "None" in kind,
        "type": {"str": "string", "float": "number", "int": "integer", "bool": "boolean"}[kind.split(" ")[0]],
    }
    if f.name in CHOICES:
        choices = CHOICES[f.name]
        entry["type"] = "choice"
        entry["choices"] = list(choices.names() if isinstance(choices, Registry) else choices)
    for bound in ("ge", "gt", "le"):
        if bound in f.metadata:
            entry[bound] = f.metadata[bound]
    return entry


@lru_cache
def options_json() -> dict[str, Any]:
    return {
        "fields": [_field(f) for f in dataclasses.fields(grpo.LossConfig)],
        "registries": {
            kind: [
                {"name": n, "doc": reg.doc(n), "details": reg.details(n), "paper": reg.paper(n)} for n in reg.names()
            ]
            for kind, reg in grpo.REGISTRIES.items()
        },
        "presets": [
            {"name": p.name, "doc": p.doc, "source": p.source, "config": grpo.LossConfig.from_preset(p.name).to_dict()}
            for p in grpo.PRESETS.values()
        ],
        "regions": list(grpo.REGIONS),
        "scenarios": [dataclasses.asdict(s) for s in SCENARIOS.values()],
        "glossary": [dataclasses.asdict(g) for g in GLOSSARY],
    }
