"""The Spark JVMs' class archive (:mod:`tests.pipeline.jvm_archive`) is a saving, never a condition: no
options while it is missing, and one a JVM cannot map is ignored without a word on the standard output,
where the pipeline commands print their JSON result."""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

import pyspark
import pytest

from . import jvm_archive


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_no_options_while_the_archive_is_missing(private_tmp: Path) -> None:
    path = jvm_archive.archive_path()
    assert path is not None and path.parent.parent == private_tmp and not path.exists()
    # -XX:SharedArchiveFile naming a missing file turns off the JDK's own class sharing too.
    assert jvm_archive.share_options() == ""
    assert jvm_archive.spark_conf()["spark.driver.defaultJavaOptions"] == jvm_archive.BASE_FLAGS


def test_an_archive_the_jvm_cannot_map_is_ignored_silently(private_tmp: Path) -> None:
    """An archive of classes from another class path (here one of Spark's jars; the JVM below has none),
    as a JVM of the tests would find one made for another: the JDK warns on stdout unless told not to."""
    path = jvm_archive.archive_path()
    assert path is not None
    jar = next((Path(pyspark.__file__).parent / "jars").glob("slf4j-api-*.jar"))
    subprocess.run(  # loads a class of the jar (it has no main method: exits 1), writes the archive
        ["java", *shlex.split(jvm_archive.BASE_FLAGS), f"-XX:ArchiveClassesAtExit={path}", "-cp", str(jar),
         "org.slf4j.helpers.Util"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert path.is_file()
    options = jvm_archive.share_options()
    assert f"-XX:SharedArchiveFile={path}" in options
    r = subprocess.run(
        ["java", *shlex.split(jvm_archive.BASE_FLAGS), *shlex.split(options), "-version"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "warning" not in r.stderr, (r.stdout, r.stderr)
