"""``GET /api/v1/options``: everything the page builds its controls from, read off grpo."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

import grpo
from grpo.corrections import CORRECTIONS
from grpo.export import FORMATS as EXPORT_FORMATS
from grpo.io import UPLOAD_FORMATS
from grpo.trainer_config import VERL_ADVANTAGES_NEED
from grpo.view.examples import SCENARIOS
from grpo.view.glossary import GLOSSARY
from grpo.view.token_fields import token_fields_json


@lru_cache
def options_json() -> dict[str, Any]:
    return {
        "fields": [spec.describe() for spec in grpo.FIELDS],
        "registries": {kind: [e.describe() for e in reg.entries()] for kind, reg in grpo.REGISTRIES.items()},
        # the rollout_correction field's modes, each with its declared level and action
        "corrections": [e.describe() for e in CORRECTIONS.entries()],
        "presets": [
            {"name": p.name, "doc": p.doc, "source": p.source, "config": grpo.LossConfig.from_preset(p.name).to_dict()}
            for p in grpo.PRESETS.values()
        ],
        "regions": list(grpo.REGIONS),
        "scenarios": [dataclasses.asdict(s) for s in SCENARIOS.values()],
        "glossary": [dataclasses.asdict(g) for g in GLOSSARY],
        # the answer's per-token arrays: label, heatmap and its centre, hover label, CSV column, in compare or not
        "token_fields": token_fields_json(),
        "formats": formats_json(),
        "batch_fields": [f.describe() for f in grpo.BATCH_FIELDS.values()],
        # the trainers' estimators no batch can reproduce, and what each would need (GAE: a critic)
        "unsupported_advantages": {f"verl:{name}": need for name, need in VERL_ADVANTAGES_NEED.items()},
    }


def formats_json() -> dict[str, Any]:
    """The batch files: what the upload reads (menu label, extensions, whether an example and an export
    exist: GET /api/v1/examples/{name}, POST /api/v1/export/{name}) and its file input's ``accept``."""
    upload = [
        {
            "name": f.name,
            "label": f.label,
            "extensions": [f".{s}" for s in f.suffixes],
            "export": f.name in EXPORT_FORMATS,
        }
        for f in UPLOAD_FORMATS
    ]
    accept = ",".join(f".{s}" for f in UPLOAD_FORMATS for s in f.suffixes)
    return {"upload": upload, "accept": accept}
