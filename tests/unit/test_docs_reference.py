"""The operator's references stay complete as keys, options and metrics are added.

Every configuration key has a help line and a row in docs/operations.md ("Configuration reference") naming
its flag, its environment variable and its default; every option and argument of every ``hubbub`` command has
a help line; every metric the docs name is exported somewhere in the code.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hubbub.cli import HELP, build_parser, default_text
from hubbub.config import env_name, flag_name
from hubbub.server_config import KEYS
from tests.conftest import REAL_LISTEN_DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
# tests/conftest.py moves the listeners' defaults off their fixed ports for the test run; the docs show the
# real ones.
REAL_DEFAULTS = REAL_LISTEN_DEFAULTS


def _reference_rows() -> dict[str, str]:
    """Key -> its table row in the configuration reference section of docs/operations.md."""
    text = OPERATIONS.read_text(encoding="utf-8")
    start = text.index("## Configuration reference")
    end = text.index("\n## ", start + 1)
    rows: dict[str, str] = {}
    for line in text[start:end].splitlines():
        m = re.match(r"\| `([a-z_.]+)` \|", line)
        if m:
            rows[m.group(1)] = line
    return rows


def test_default_text_is_what_an_operator_types() -> None:
    assert default_text("native.enabled") == "true"
    assert default_text("auth.tokens") == "{}"
    assert default_text("upstream") == "[]"
    assert default_text("broker") == '""'
    assert default_text("limits.max_frame") == "1048576"
    assert default_text("data_dir") == "./hubbub-data"


@pytest.mark.parametrize("key", list(KEYS))
def test_every_key_has_help_and_a_reference_row(key: str) -> None:
    assert HELP.get(key), f"{key}: no help line in hubbub/cli.py HELP"
    rows = _reference_rows()
    assert key in rows, f"{key}: no row in docs/operations.md 'Configuration reference'"
    cells = [c.strip() for c in rows[key].strip("|").split(" | ")]
    assert f"`{flag_name(key)}`" in cells[1] and f"`{env_name(key)}`" in cells[1], rows[key]
    assert cells[2] == f"`{REAL_DEFAULTS.get(key) or default_text(key)}`", rows[key]


def test_reference_has_no_row_for_an_unknown_key() -> None:
    assert sorted(set(_reference_rows()) - set(KEYS)) == []


def _actions(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _actions(sub, f"{name} {sub_name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield name, action


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"{cmd}: {'/'.join(a.option_strings) or a.metavar or a.dest}"
        for cmd, a in _actions(build_parser(), "hubbub")
        if not a.help or a.help == a.dest
    ]
    assert missing == []


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: p.name
)
def test_metrics_named_in_the_docs_exist(page: Path) -> None:
    """A metric a page names (in backticks; ``hubbub_x_*`` for a family) is exported by the code: by its name
    (``_total`` is the exposition's suffix of a counter), or by an f-string family such as
    ``f"hubbub_cluster_{name}"``."""
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "src" / "hubbub").rglob("*.py"))
    literal = set(re.findall(r"\"(hubbub_[a-z_]+)\"", code))
    families = set(re.findall(r"f\"(hubbub_[a-z_]+_)\{", code))
    named = set(re.findall(r"`(hubbub_[a-z_]+\*?)", page.read_text(encoding="utf-8")))
    if page == OPERATIONS:
        assert named
    unknown = []
    for name in sorted(named):
        if name.endswith("*"):
            prefix = name[:-1]
            ok = any(n.startswith(prefix) for n in literal) or any(f.startswith(prefix) for f in families)
        else:
            base = name.removesuffix("_total")
            ok = base in literal or name in literal or any(base.startswith(f) for f in families)
        if not ok:
            unknown.append(name)
    assert unknown == []


def test_every_hubbub_variable_in_the_tree_is_a_key_or_documented() -> None:
    """``hubbub serve`` refuses ``HUBBUB_*`` variables it does not know (config.py ``OTHER_ENV``): one that
    the clients, the pipeline or the tests read must be listed there and in docs/operations.md, or setting
    it would stop the server."""
    from hubbub.config import OTHER_ENV

    keys = {env_name(key) for key in KEYS}
    seen: set[str] = set()
    for sub in ("src", "tests", "bench", "fuzz", "tools", "docs"):
        for path in (ROOT / sub).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".md", ".mjs", ".js", ".sh", ".toml", ".yml"):
                seen |= set(re.findall(r"\bHUBBUB_[A-Z0-9_]*[A-Z0-9]\b", path.read_text("utf-8", "replace")))
    example = {"HUBBUB_" + "DURABILTY"}  # docs/operations.md's example of a misspelt variable
    unknown = sorted(seen - keys - OTHER_ENV.keys() - example)
    assert not unknown, f"HUBBUB_* variables neither a key nor in config.OTHER_ENV: {unknown}"
    section = OPERATIONS.read_text(encoding="utf-8").split("### Environment variables that are not keys")[1]
    section = section.split("\n#")[0]
    for name in OTHER_ENV:
        assert f"`{name}`" in section, f"{name}: not in docs/operations.md 'Environment variables that …'"
