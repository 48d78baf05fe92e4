"""The PostgreSQL engine sends every array parameter in binary (``%b``), never as psycopg's text arrays.

psycopg builds a text array in Python and escapes each ``bytea`` element through a regular expression: about
4 µs per 100-byte payload, and over 100 µs for one full of bytes that need escaping. That was most of a
publishing node's CPU (bench/RESULTS.md, "Cluster path"); the binary form costs about 0.2 µs an element.
"""

from __future__ import annotations

import re
from pathlib import Path

import hubbub.log.postgres

ENGINE = Path(hubbub.log.postgres.__file__).parent
# A ``%s`` placeholder cast to an array type, or compared with ANY(): an array sent in the text format.
TEXT_ARRAY = re.compile(r"%s::\w+\[\]|ANY\(%s\)")


def test_the_engine_has_array_parameters_to_check() -> None:
    sources = "".join(p.read_text() for p in ENGINE.glob("*.py"))
    assert sources.count("%b::bytea[]") >= 8


def test_no_array_parameter_is_sent_as_text() -> None:
    found = [
        f"{p.name}:{n}: {line.strip()}"
        for p in sorted(ENGINE.glob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if TEXT_ARRAY.search(line)
    ]
    assert found == []
