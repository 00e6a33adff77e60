"""A run's timeline as GET /api/v1/runs/{run}/timeline answers it: ``grpo.runs.timeline`` under the server's
anomaly thresholds (its ``timeline_<field>`` settings), kept beside the run or in the cache directory, computed
in the lane its step files' size calls for. Its ETag follows from the run's scan (``app.summaries.timeline_etag``).
"""

from __future__ import annotations

import os
from contextlib import suppress
from dataclasses import fields
from pathlib import Path
from typing import Any

from app.lanes import Lanes
from app.run_files import Scan, computed_once, lane_size, read_info
from app.settings import Settings
from app.store import vanished_as_404
from app.work import Reply
from grpo.runs import AnomalyThresholds, timeline


def anomaly_thresholds(settings: Settings) -> AnomalyThresholds:
    """The server's anomaly thresholds: its ``timeline_<field>`` settings (a field without one: the default)."""
    named = {f.name: f"timeline_{f.name}" for f in fields(AnomalyThresholds)}
    return AnomalyThresholds(**{k: getattr(settings, v) for k, v in named.items() if v in Settings.model_fields})


def timeline_cache_dir(settings: Settings) -> Path | None:
    """The timeline cache for read-only run directories: made private to this user (mode 0700) when absent,
    used only while it is this user's directory (a temp dir another user made first is not written to)."""
    path = settings.cache_dir
    with suppress(OSError):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.geteuid():
            return path
    return None


def timeline_json(path: str, settings: Settings) -> Any:
    """GET /api/v1/runs/{run}/timeline: ``grpo.runs.timeline`` under the server's thresholds, kept beside the run
    (in ``cache_dir`` when the run directory cannot be written) and extended from new step files (a lane's job)."""
    run_dir = Path(path)
    with vanished_as_404(run_dir):
        read_info(run_dir)
        return timeline(run_dir, anomaly_thresholds(settings), cache_dir=timeline_cache_dir(settings))


async def timeline_reply(lanes: Lanes, path: Path, found: Scan, etag: str | None, settings: Settings) -> Reply:
    """A run's timeline in the lane its step files' size calls for (a worker process for a long run; a kept one is
    answered from its file there); concurrent first reads of one state of the run share the computation."""
    key = (f"timeline:{path}", f"{found.files}\t{etag}")
    size = lane_size(found.step_bytes, found.step_files)
    return await computed_once(lanes, key, size, timeline_json, str(path), settings)
