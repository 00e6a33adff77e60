"""Every registered variant and preset is documented (a tooltip line, a paper link) and offered in
README.md's tables."""

from __future__ import annotations

import re

import pytest
from readme_check import README as README_PATH
from readme_check import missing_rows

import grpo

README = README_PATH.read_text(encoding="utf-8")
ENTRIES = [(kind, name) for kind, registry in grpo.REGISTRIES.items() for name in registry.names()]


def test_the_four_registries_are_the_four_choice_fields() -> None:
    assert set(grpo.REGISTRIES) == {"advantage", "objective", "kl_estimator", "aggregation"}
    assert all(len(registry.names()) >= 3 for registry in grpo.REGISTRIES.values())


@pytest.mark.parametrize(("kind", "name"), ENTRIES, ids=[f"{k}:{n}" for k, n in ENTRIES])
def test_entry_has_a_tooltip_a_label_and_a_paper(kind: str, name: str) -> None:
    entry = grpo.REGISTRIES[kind].entry(name)
    assert entry.doc and len(entry.doc) < 160 and not entry.doc.startswith("Paper:"), entry.doc
    assert re.fullmatch(r"https?://\S+", entry.paper), entry.paper
    assert "Paper:" not in entry.details
    assert entry.label and len(entry.label) < 40


def test_every_entry_and_preset_is_in_the_readme_tables() -> None:
    assert missing_rows(README, grpo.REGISTRIES, grpo.PRESETS) == []


def test_the_readme_check_reports_what_is_missing() -> None:
    """The check itself: a row without a name, and a missing preset row, are both reported."""
    trimmed = README.replace("`cispo`, ", "").replace("| `trl-sapo` |", "| trl-sapo |")
    assert missing_rows(trimmed, grpo.REGISTRIES, grpo.PRESETS) == ["objective:cispo", "preset:trl-sapo"]


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
