"""docs/python.md covers every `python -m grpo` command: each subcommand of the CLI's own parser, each of
its options and each choice of a positional, so a command or flag added to grpo/__main__.py is reported
until it is documented."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import grpo.__main__

DOC = Path(__file__).resolve().parents[1] / "docs" / "python.md"


class _Parsed(Exception):
    """Raised in place of parsing, to hand back the parser ``main`` built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parsed")
        self.parser = parser


def cli_parser(monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser ``grpo.__main__.main`` builds, taken as it parses (nothing runs)."""

    def parse_args(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    with pytest.raises(_Parsed) as parsed:
        grpo.__main__.main([])
    return parsed.value.parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def section(doc: str, command: str) -> str:
    """The doc's ``### `command` `` section, up to the next heading ("" when there is none)."""
    head = f"### `{command}`\n"
    if head not in doc:
        return ""
    rest = doc.split(head, 1)[1]
    return rest.split("\n#", 1)[0]


def undocumented(doc: str, commands: dict[str, argparse.ArgumentParser]) -> list[str]:
    """Each command the doc does not name, and each option or positional choice its section leaves out."""
    missing = []
    for name, sub in commands.items():
        text = section(doc, name)
        if not text:
            missing.append(f"a section ### `{name}`")
        if f"python -m grpo {name}" not in doc:
            missing.append(f"python -m grpo {name}")
        for action in sub._actions:
            named = [flag for flag in action.option_strings if flag.startswith("--") and flag != "--help"]
            choices = [] if action.option_strings else [str(c) for c in action.choices or ()]
            missing += [f"{name}: {word}" for word in [*named, *choices] if word not in text]
    return missing


def test_every_command_its_options_and_choices_are_in_the_python_doc(monkeypatch: pytest.MonkeyPatch) -> None:
    commands = subcommands(cli_parser(monkeypatch))
    assert {"eval", "check-run", "import"} <= set(commands)  # the parser was reached
    assert undocumented(DOC.read_text(encoding="utf-8"), commands) == []


def test_the_check_names_what_a_doc_leaves_out(monkeypatch: pytest.MonkeyPatch) -> None:
    commands = subcommands(cli_parser(monkeypatch))
    doc = DOC.read_text(encoding="utf-8")
    without_import = doc.split("### `import`", 1)[0].replace("python -m grpo import", "python -m grpo")
    assert undocumented(without_import, commands) == [
        "a section ### `import`",
        "python -m grpo import",
        "import: nemo-rl",
        "import: slime",
        "import: --config",
    ]
    assert undocumented(doc.replace("--metric-atol", "--metric-tol"), commands) == ["check-run: --metric-atol"]
