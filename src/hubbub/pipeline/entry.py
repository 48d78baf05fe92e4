"""The ``hubbub`` format's :class:`HubbubDataSource`: the class Spark finds, registers and creates.

PySpark 4 looks the class up in every session on a machine with hubbub's ``spark`` extra, whether or not the
session reads or writes hubbub (it imports every ``pyspark_*`` module on the Python path, here
``pyspark_hubbub``, to learn its source's name), and creates it at every ``load()`` and ``save()``, each
time in a Python worker process. So this module imports PySpark's data source API and the options' checks
and nothing more: the readers (:mod:`hubbub.pipeline.datasource`, with pyarrow, the log's engines and the
HTTP client) and the writers (:mod:`hubbub.pipeline.sink`) are imported where Spark asks for one, and the
record schema where it asks for the schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from hubbub.errors import PipelineError
from hubbub.pipeline.options import check_known

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["HubbubDataSource"]


class HubbubDataSource(DataSource):  # type: ignore[misc]
    """``format("hubbub")``: see :mod:`hubbub.pipeline.datasource`."""

    def __init__(self, options: dict[str, str]) -> None:
        # Spark creates the source at load() (without .schema(...)) and at save(): refuse an unknown option,
        # or a value no option of that name takes, there, not once the query runs.
        check_known(options)
        super().__init__(options)

    @classmethod
    def name(cls) -> str:
        return "hubbub"

    def schema(self) -> str:
        from hubbub.log.records import SPARK_DDL

        return SPARK_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        from hubbub.pipeline.datasource import batch_reader

        return batch_reader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from hubbub.pipeline.datasource import stream_reader

        return stream_reader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from hubbub.pipeline.sink import HubbubWriter

        _appends_only(overwrite, 'mode("overwrite")', 'mode("append")')
        return HubbubWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from hubbub.pipeline.sink import HubbubStreamWriter

        _appends_only(overwrite, 'outputMode("complete")', 'outputMode("append")')
        return HubbubStreamWriter(dict(self.options), schema)


def _appends_only(overwrite: bool, asked: str, use: str) -> None:
    """The sink appends to the log: a write that would replace what the target holds is refused (Spark
    refuses the other save modes, ignore and error, itself)."""
    if overwrite:
        raise PipelineError(
            f"hubbub sink: {asked} would replace what the server holds, and a log is only appended to; "
            f"use {use} (rows already published are acknowledged as duplicates, not appended again)"
        )
