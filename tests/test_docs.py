"""Every registered variant and preset is documented (a tooltip line, a paper link) and offered in
README.md's tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import grpo

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
ENTRIES = [(kind, name) for kind, registry in grpo.REGISTRIES.items() for name in registry.names()]


def test_the_four_registries() -> None:
    assert set(grpo.REGISTRIES) == {"advantage", "objective", "kl_estimator", "aggregation"}
    assert len(ENTRIES) == 3 + 4 + 3 + 4


@pytest.mark.parametrize(("kind", "name"), ENTRIES, ids=[f"{k}:{n}" for k, n in ENTRIES])
def test_entry_has_a_tooltip_and_a_paper(kind: str, name: str) -> None:
    registry = grpo.REGISTRIES[kind]
    doc = registry.doc(name)
    assert doc and len(doc) < 160 and not doc.startswith("Paper:"), doc
    assert re.fullmatch(r"https?://\S+", registry.paper(name)), registry.paper(name)
    assert "Paper:" not in registry.details(name)


@pytest.mark.parametrize(("kind", "name"), ENTRIES, ids=[f"{k}:{n}" for k, n in ENTRIES])
def test_entry_is_in_the_readme_table(kind: str, name: str) -> None:
    row = next(line for line in README.splitlines() if line.startswith(f"| `{kind}` |"))
    assert f"`{name}`" in row


@pytest.mark.parametrize("preset", list(grpo.PRESETS))
def test_preset_is_in_the_readme_table(preset: str) -> None:
    assert re.search(rf"^\| `{re.escape(preset)}` \| \S", README, flags=re.MULTILINE), preset


def test_registry_getter_lists_valid_names() -> None:
    for kind, registry in grpo.REGISTRIES.items():
        with pytest.raises(grpo.GrpoInputError) as err:
            registry.get("nope")
        assert err.value.field == kind
        assert all(name in str(err.value) for name in registry.names())
        assert "nope" not in registry and registry.names()[0] in registry


def test_every_region_is_named() -> None:
    assert grpo.REGIONS[0] == "masked"  # code 0 is what masked positions hold
    assert set(grpo.REGIONS) == {"masked", "trust", "clip_low", "clip_high", "dual_clip"}
