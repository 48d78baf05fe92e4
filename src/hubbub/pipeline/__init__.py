"""The data pipeline on Apache Spark (installed with the ``spark`` extra: ``pip install hubbub[spark]``).

* :mod:`hubbub.pipeline.datasource`: the Spark data source ``hubbub`` (batch and streaming read and write);
  :mod:`hubbub.pipeline.entry` has its class, which Spark imports in every session, with nothing heavy.
* :mod:`hubbub.pipeline.options`: the source's and the sink's options, each with the parser of its value.
* :mod:`hubbub.pipeline.sources`: the log readers (a store, read-only; a running server over HTTP) and the
  idempotent HTTP publisher the sink uses. No Spark.
* :mod:`hubbub.pipeline.jobs`: archive, stats, audit, retention, compact, export and backfill.
* :mod:`hubbub.pipeline.cli`: ``hubbub pipeline <job>``.

The source registers itself (the ``pyspark_hubbub`` module exports ``DefaultSource``, which PySpark 4 looks up
on the Python path); ``spark.dataSource.register(HubbubDataSource)`` does it explicitly. It never imports
``hubbub.core`` or ``hubbub.transports`` (an import-linter contract). See docs/pipeline.md.
"""

from __future__ import annotations

__all__ = ["HubbubDataSource"]


def __getattr__(name: str) -> object:
    # Lazy: importing the package (the CLI does) must not import pyspark.
    if name == "HubbubDataSource":
        from hubbub.pipeline.entry import HubbubDataSource

        return HubbubDataSource
    raise AttributeError(name)
