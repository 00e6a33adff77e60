"""docs/variants.md's variant and preset tables, checked against the registries they document.

Each registry has one row, ``| `kind` | `name` (...), `name`, ... |``, and each preset its own
row, ``| `preset` | what it reproduces |``. ``missing_rows`` names every registered entry the
README leaves out, so a new variant (a plugin's included) is reported until it is documented.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[1] / "docs" / "variants.md"


def missing_rows(readme: str, registries: Mapping[str, Any], presets: Iterable[str]) -> list[str]:
    """``kind:name`` for each registered variant absent from its kind's row (``kind:`` when the
    row itself is missing), and ``preset:name`` for each preset without a row of its own."""
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([\w-]+)` \|.*$", readme, flags=re.MULTILINE)}
    missing = []
    for kind, registry in registries.items():
        if kind not in rows:
            missing.append(f"{kind}:")
            continue
        missing += [f"{kind}:{name}" for name in registry.names() if f"`{name}`" not in rows[kind]]
    missing += [f"preset:{name}" for name in presets if not re.search(rf"^\| `{re.escape(name)}` \| \S", readme, re.M)]
    return missing
