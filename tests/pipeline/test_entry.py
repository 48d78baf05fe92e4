"""PySpark imports every ``pyspark_*`` module on the Python path in every session, to learn the names of their
data sources: ``pyspark_hubbub`` must cost such a session no more than hubbub's format class, never the
readers and writers (pyarrow, the log's engines, the HTTP client), which Spark's workers import when a
query reads or writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hubbub
import hubbub.pipeline
from hubbub.pipeline import datasource, entry

pytestmark = pytest.mark.spark

#: What a query's reader or writer imports and the lookup must not.
HEAVY = (
    "pyarrow",
    "hubbub.log",
    "hubbub.client",
    "hubbub.pipeline.datasource",
    "hubbub.pipeline.sink",
    "hubbub.pipeline.sources",
)

_LOOKUP = """
import io, json, sys
from pyspark.sql.worker.lookup_data_sources import _main
out = io.BytesIO()
_main(io.BytesIO(), out)
print(json.dumps({"out": out.getvalue().hex(), "heavy": [m for m in HEAVY if m in sys.modules]}))
"""


def _fresh(code: str) -> dict[str, object]:
    """``code``'s printed JSON, run by a fresh interpreter with this checkout's package on its path."""
    env = dict(os.environ)
    src = str(Path(hubbub.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{code}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return got


def test_sparks_lookup_finds_the_source_without_its_readers_and_writers() -> None:
    got = _fresh(_LOOKUP)
    assert b"hubbub" in bytes.fromhex(str(got["out"])), got  # the name Spark registers the source under
    assert got["heavy"] == []


def test_the_format_class_is_one_class_wherever_it_is_imported_from() -> None:
    import pyspark_hubbub

    assert pyspark_hubbub.DefaultSource is entry.HubbubDataSource
    assert datasource.HubbubDataSource is entry.HubbubDataSource
    assert hubbub.pipeline.HubbubDataSource is entry.HubbubDataSource
    assert entry.HubbubDataSource.name() == "hubbub"


def test_creating_the_source_checks_its_options_and_gives_the_schema_without_the_readers() -> None:
    got = _fresh(
        "import json, sys\n"
        "from pyspark_hubbub import DefaultSource\n"
        "ddl = DefaultSource({'url': 'sqlite:///x.db'}).schema()\n"
        "try:\n"
        "    DefaultSource({'url': 'sqlite:///x.db', 'startSeqq': '1'})\n"
        "    refused = ''\n"
        "except Exception as exc:\n"
        "    refused = str(exc)\n"
        "print(json.dumps({'ddl': ddl, 'refused': refused,"
        " 'heavy': [m for m in HEAVY if m in sys.modules and m != 'hubbub.log']}))"
    )
    assert str(got["ddl"]).startswith("channel STRING NOT NULL, seq BIGINT NOT NULL")
    assert "startSeqq" in str(got["refused"]) and "startSeq" in str(got["refused"]).replace("startSeqq", "")
    assert got["heavy"] == []
