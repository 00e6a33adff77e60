"""What the lab offers, as GET /api/v1/lab/tasks answers it: its tasks, canned comparisons (each run as the
POST body that starts it), metrics and loop settings with their defaults."""

from __future__ import annotations

import dataclasses
from typing import Any

from grpo.lab import COMPARISONS, DEFAULT_TASK, METRICS, TASKS
from grpo.lab.train import LabConfig


def tasks_json() -> dict[str, Any]:
    """GET /api/v1/lab/tasks: the lab's tasks, canned comparisons (each run as the POST body that starts
    it), metrics and loop settings with their defaults."""
    defaults = LabConfig()
    knobs = [
        {"name": f.name, "default": getattr(defaults, f.name), "doc": f.metadata.get("doc", "")}
        for f in dataclasses.fields(LabConfig)
        if f.name not in ("task", "loss", "hidden")
    ]
    tasks = [
        {"name": t.name, "doc": t.doc, "teaches": t.teaches, "max_completion_length": t.max_completion_length}
        for t in TASKS.values()
    ]
    comparisons = [
        {
            "name": c.name,
            "title": c.title,
            "watch": c.watch,
            "metrics": list(c.metrics),
            "overlay": c.overlay,
            "runs": [run_request(r) for r in c.runs],
        }
        for c in COMPARISONS.values()
    ]
    return {
        "default": DEFAULT_TASK,
        "tasks": tasks,
        "metrics": list(METRICS),
        "settings": knobs,
        "comparisons": comparisons,
    }


def run_request(config: LabConfig) -> dict[str, Any]:
    """The POST body that starts ``config``: the loss as a whole resolved config."""
    fields = config.to_dict()
    loss = {k: v for k, v in fields.pop("loss").items() if k not in ("device", "dtype")}
    fields.pop("hidden")
    return fields | {"config": loss | {"preset": loss.get("preset") or "article"}}
