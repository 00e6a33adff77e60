"""Every registered variant and preset is documented (a tooltip line, a paper link) and offered in
docs/variants.md's tables; the README is the front door and every link in the docs resolves; docs/tests.md
names every test file, with a line on what it checks, and every browser test."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from readme_check import README as README_PATH
from readme_check import missing_rows

import grpo

README = README_PATH.read_text(encoding="utf-8")
README_FRONT = Path(__file__).resolve().parents[1] / "README.md"
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


DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_docs_list_every_browser_test() -> None:
    listed = (DOCS / "tests.md").read_text(encoding="utf-8")
    files = sorted(DOCS.parent.joinpath("tests").glob("test_*browser*.py"))
    assert len(files) >= 4
    missing = [
        f"{path.name}::{node.name}"
        for path in files
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and f"`{node.name}`" not in listed
    ]
    assert missing == []


def test_the_docs_name_every_test_file() -> None:
    listed = (DOCS / "tests.md").read_text(encoding="utf-8")
    files = sorted(DOCS.parent.joinpath("tests").glob("test_*.py"))
    assert len(files) > 90  # the scan saw the suite
    assert [path.name for path in files if f"- `{path.name}`: " not in listed] == []


def test_the_readme_is_the_front_door_and_its_links_resolve() -> None:
    readme = README_FRONT.read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    for doc in [README_FRONT, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)\)", doc.read_text(encoding="utf-8")):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"
