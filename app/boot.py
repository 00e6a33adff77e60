"""What the dashboard page carries from the start: the options its controls are built from and, for a
link that names only a scenario and settings, the answer to the request the page would send first.

The page reads these from a ``<script type="application/json">`` block (data, never executed: the CSP
stays ``script-src 'self'``) and skips two round trips before its first view. The answer is computed by
the same ``work.loss`` as ``POST /api/v1/loss``, in the same lane; the page uses it only when the
request it would send equals ``request`` here, else it asks the API as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import grpo
from app import work
from app.lanes import Lanes
from app.options import options_json
from app.settings import Settings
from grpo.view.answer import dumps
from grpo.view.examples import SCENARIOS

# URL parameters the page writes that do not change the /api/v1/loss request (state.js writeURL).
DISPLAY_ONLY = {"row", "compare", "compare_edits", "compare_max_completion_length"}


@lru_cache
def options_bytes() -> bytes:
    return dumps(options_json())


def _value(kind: str, raw: str) -> Any:
    """A URL parameter as state.js's readURL reads it (ValueError where the page would read NaN)."""
    if raw == "null":
        return None
    if kind == "boolean":
        return raw == "true"
    if kind in ("number", "integer"):
        number = float(raw)
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError(raw)
        return int(number) if number.is_integer() else number
    return raw


def first_request(params: Mapping[str, str]) -> dict[str, Any] | None:
    """The /api/v1/loss body the page sends first for a URL with these parameters, or None for a link
    whose input only the page can read (an edited batch) or a parameter it does not know."""
    fields = {spec.name: spec for spec in grpo.FIELDS}
    scenario = SCENARIOS.get(params.get("scenario", "article")) or SCENARIOS["article"]
    config: dict[str, Any] = {"preset": params.get("preset") or "article"}
    for key, raw in params.items():
        if key in ("scenario", "preset") or key in DISPLAY_ONLY:
            continue
        spec = fields.get(key)
        if spec is None:
            return None
        try:
            config[key] = _value(spec.describe()["type"], raw)
        except ValueError:
            return None
    return {**scenario.request, "config": config}


async def boot_json(params: Mapping[str, str], lanes: Lanes, settings: Settings) -> str:
    """The page's boot block for a URL with these parameters: ``{"options": ..., "first": {"request",
    "answer"} | null}`` as JSON text safe inside a script element (every ``<`` escaped)."""
    body = first_request(params)
    first = b"null"
    if body is not None:
        raw = dumps(body)
        reply = await lanes.run(len(raw), work.loss, raw, settings)
        if reply.status == 200:  # an error is the API's to report: the page then asks it
            first = b'{"request":' + raw + b',"answer":' + reply.body + b"}"
    text = b'{"options":' + options_bytes() + b',"first":' + first + b"}"
    return text.decode().replace("<", "\\u003c")
