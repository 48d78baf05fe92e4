"""The static checks run as part of the test suite, so the one README test command covers them."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: install the dev extra (pip install -e '.[dev]')")
    return found


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"


def test_ruff_lint() -> None:
    _run(_tool("ruff"), "check", "src", "tests", "fuzz", "bench")


def test_ruff_format() -> None:
    _run(_tool("ruff"), "format", "--check", "src", "tests", "fuzz", "bench")


def test_mypy_strict() -> None:
    _run(_tool("mypy"))


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _installed_with(requirements: list[str]) -> set[str]:
    """The distributions a plain install of ``requirements`` brings (their dependencies, and the extras they
    ask for), by their canonical names, as far as this environment can tell."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.distribution(req.name).requires or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append(dep)
    return {name for name, _ in seen}


def _imported(paths: list[Path]) -> set[str]:
    """The top-level names of the modules ``paths`` import absolutely."""
    imported: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    return imported


def test_mypy_covers_every_import_of_an_optional_extra() -> None:
    """``test_mypy_strict`` passes with the ``dev`` extra alone: a third-party module that src/hubbub imports
    and that the base dependencies do not install (the ``spark`` extra's pyarrow, pandas, numpy, ...), or
    that a test, a benchmark or a fuzz target imports and the base dependencies and the ``dev`` extra do not
    install, is in a mypy override with ``ignore_missing_imports``, else mypy fails where it is not
    installed."""
    project = _pyproject()
    base = _installed_with(project["project"]["dependencies"])
    with_dev = _installed_with(
        [*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["dev"]]
    )
    covered: set[str] = set()
    for override in project["tool"]["mypy"]["overrides"]:
        if override.get("ignore_missing_imports"):
            covered |= {m.removesuffix(".*") for m in override["module"]}
    owners = metadata.packages_distributions()
    # The project's own, and the scripts of bench/ and fuzz/, which import each other (and tests/' helpers,
    # such as pgserver) from sys.path.
    scripts = [*(ROOT / "bench").glob("*.py"), *(ROOT / "fuzz").glob("*.py")]
    helpers = [*scripts, *(ROOT / "tests").glob("*.py")]
    local = {"hubbub", "pyspark_hubbub", "tests", *(p.stem for p in helpers)}

    def optional(imported: set[str], installed: set[str]) -> set[str]:
        return {
            m
            for m in imported - set(sys.stdlib_module_names) - local
            if not any(canonicalize_name(d) in installed for d in owners.get(m, []))
        }

    of_src = optional(_imported(_sources()), base)
    of_tests = optional(_imported([*sorted((ROOT / "tests").rglob("*.py")), *scripts]), with_dev)
    assert of_src, "the scan found no import of an optional extra in src: the scan is broken"
    assert of_tests, "the scan found no import of an optional extra in tests: the scan is broken"
    missing = sorted((of_src | of_tests) - covered)
    assert missing == [], "add these to a [[tool.mypy.overrides]] of pyproject.toml"


def test_import_layers() -> None:
    _run(_tool("lint-imports"))


#: The most lines of a module in src/hubbub (STYLE: split a module that passes about 800 lines).
MAX_MODULE_LINES = 800
#: The most lines of a class in the packages that hold connection and core state.
MAX_CLASS_LINES = 300
CLASS_LIMITED = ("core", "transports", "client")
#: Classes over the limit today, each with its line count then: a ratchet, as OVER_MODULE_LIMIT.
OVER_CLASS_LIMIT: dict[str, int] = {}
#: Modules over the limit today, each with its line count then: a ratchet. The entry must go once the module
#: is split (the test fails when the module shrank below the limit or grew past its count).
OVER_MODULE_LIMIT: dict[str, int] = {}


def _sources() -> list[Path]:
    return sorted((ROOT / "src" / "hubbub").rglob("*.py"))


def test_no_module_over_the_line_limit() -> None:
    too_long: list[str] = []
    for path in _sources():
        rel = path.relative_to(ROOT / "src" / "hubbub").as_posix()
        n = len(path.read_text(encoding="utf-8").splitlines())
        allowed = OVER_MODULE_LIMIT.get(rel)
        if allowed is not None:
            assert n > MAX_MODULE_LINES, f"{rel} is {n} lines now: remove it from OVER_MODULE_LIMIT"
            if n > allowed:
                too_long.append(f"{rel}: {n} lines (at most {allowed} until it is split)")
        elif n > MAX_MODULE_LINES:
            too_long.append(f"{rel}: {n} lines")
    assert not too_long, "modules over the limit (split them):\n" + "\n".join(too_long)


def test_no_class_over_the_line_limit_in_core_transports_and_client() -> None:
    import ast

    too_long: list[str] = []
    for pkg in CLASS_LIMITED:
        for path in sorted((ROOT / "src" / "hubbub" / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    n = (node.end_lineno or node.lineno) - start + 1
                    key = f"{pkg}/{path.name}:{node.name}"
                    allowed = OVER_CLASS_LIMIT.get(key)
                    if allowed is not None:
                        assert n > MAX_CLASS_LINES, f"{key} is {n} lines now: remove it from OVER_CLASS_LIMIT"
                        if n > allowed:
                            too_long.append(f"{key}: {n} lines (at most {allowed} until it is split)")
                    elif n > MAX_CLASS_LINES:
                        too_long.append(f"{pkg}/{path.name}: class {node.name} is {n} lines")
    assert not too_long, "classes over the limit (split them):\n" + "\n".join(too_long)


def test_transports_never_hand_the_core_a_function_over_the_store() -> None:
    """Transports read the log through the typed reads (``Node.read_channel``, ``list_channels``, ...) and
    name a replay by a selection (``hubbub/selection.py``), never by a function over the store: no
    transport names the store's interface at all."""
    offenders = [
        f"{p.name}:{i}"
        for p in sorted((ROOT / "src" / "hubbub" / "transports").glob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "reads.call(" in line or "planner" in line or "LogStore" in line
    ]
    assert not offenders, offenders


#: What transports may import of the core (core/api.py says why).
CORE_FOR_TRANSPORTS = {"hubbub.core.api", "hubbub.core.session", "hubbub.core.flag", "hubbub.core.flushes"}


def test_transports_import_only_the_core_api_and_its_seams() -> None:
    """Transports see the node through :class:`hubbub.core.api.Core` only: no import of the core's package
    (which names the node) nor of a part; the import-linter contract forbids every other core module."""
    import ast
    import tomllib

    offenders: list[str] = []
    for path in sorted((ROOT / "src" / "hubbub" / "transports").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                core = name == "hubbub.core" or name.startswith("hubbub.core.")
                if core and name not in CORE_FOR_TRANSPORTS:
                    offenders.append(f"{path.name}:{node.lineno}: {name}")
    assert offenders == []
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = next(
        c
        for c in config["tool"]["importlinter"]["contracts"]
        if c.get("source_modules") == ["hubbub.transports"] and "hubbub.core.node" in c["forbidden_modules"]
    )
    modules = {f"hubbub.core.{p.stem}" for p in (ROOT / "src" / "hubbub" / "core").glob("*.py")}
    assert set(contract["forbidden_modules"]) == modules - CORE_FOR_TRANSPORTS - {"hubbub.core.__init__"}


#: What every transport may import of ``hubbub.dialects`` besides a dialect's public module.
DIALECT_INTERFACE = {"actions", "spec", "registry"}


def test_transports_use_a_dialect_through_its_public_module_only() -> None:
    """A transport imports of a dialect only the module that holds its registered ``SPEC`` (which re-exports
    what transports need), never its internals, for every dialect in the registry, a new one included: the
    rule names no dialect, so a dialect added to the registry is under it without an edit here."""
    import importlib

    from hubbub.dialects.registry import SPECS

    specs = list(SPECS.values())
    public = {
        p.stem
        for p in (ROOT / "src" / "hubbub" / "dialects").glob("*.py")
        if any(
            getattr(importlib.import_module(f"hubbub.dialects.{p.stem}"), "SPEC", None) is s for s in specs
        )
    }
    assert len(public) == len(specs), "each registered spec lives in a dialect module of its own"
    allowed = public | DIALECT_INTERFACE
    offenders: list[str] = []
    for path in sorted((ROOT / "src" / "hubbub" / "transports").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "hubbub.dialects":
                    names = [a.name for a in node.names]
                elif node.module.startswith("hubbub.dialects."):
                    names = [node.module.split(".")[2]]
            elif isinstance(node, ast.Import):
                names = [a.name.split(".")[2] for a in node.names if a.name.startswith("hubbub.dialects.")]
            offenders += [
                f"{path.name}:{node.lineno}: hubbub.dialects.{n}" for n in names if n not in allowed
            ]
    assert offenders == []
