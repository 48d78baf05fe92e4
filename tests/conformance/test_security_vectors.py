"""hubbub's own conformance cases for authentication and permissions (protocols README §6, each dialect's
"Auth" section), in the shared vector format, one file per landed dialect in ``security/``.

Each dialect has cases for: the token presentations and their failure, publish denied, subscribe denied
(events skipped, not the subscription refused: README §3), log read denied, and admin-only operations
denied without the ``admin`` claim (native trim, guble ``/admin/*``; ivy has none). They run through the
same runner as the shared vectors, each against a fresh server with ``auth.mode = token``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .test_vectors import IMPLEMENTED_DIALECTS
from .test_vectors import test_vector as run_vector

HERE = Path(__file__).resolve().parent / "security"
FILES = ("native", "guble", "ivy", "wearscript", "mist", "qpubs", "mqtt")
#: Dialects with no log reads of their own (no replay: wearscript.md §6, mist.md §6, qpubs.md §7; MQTT's
#: persistent sessions read through durable consumers, whose refusal is the SUBSCRIBE's 0x80).
NO_LOG_READS = frozenset({"wearscript", "mist", "qpubs", "mqtt"})


def load() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for dialect in FILES:
        out.extend((dialect, c) for c in json.loads((HERE / f"{dialect}.json").read_text(encoding="utf-8")))
    return out


CASES = load()


@pytest.mark.parametrize(("dialect", "case"), [pytest.param(d, c, id=c["id"]) for d, c in CASES])
def test_security_vector(
    dialect: str, case: dict[str, Any], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    run_vector(dialect, case, 1, tmp_path, request)


def test_every_dialect_covered() -> None:
    """Every landed dialect has its file, and each file covers the four permission refusals."""
    assert set(FILES) >= IMPLEMENTED_DIALECTS
    ids = {c["id"] for _, c in CASES}
    assert len(ids) == len(CASES), "case ids must be unique"
    for dialect in FILES:
        for kind in ("publish-denied", "subscribe-denied", "log-read-denied"):
            if kind == "log-read-denied" and dialect in NO_LOG_READS:
                continue
            assert f"{dialect}.auth-{kind}" in ids, f"{dialect} lacks its {kind} case"
    assert "native.auth-trim-denied" in ids and "guble.auth-admin-denied" in ids
