"""Auto-registration of the ``hubbub`` Spark data source.

PySpark 4 looks up every top-level module named ``pyspark_*`` on the Python path, and registers the
``DefaultSource`` it exports under ``DefaultSource.name()``; so ``spark.read.format("hubbub")`` works with no
``spark.dataSource.register(...)`` call once hubbub is installed with the ``spark`` extra. PySpark imports
it in every session to learn that name, so it imports only :mod:`hubbub.pipeline.entry`, which imports the
readers and writers when a query asks for them.
"""

from hubbub.pipeline.entry import HubbubDataSource as DefaultSource

__all__ = ["DefaultSource"]
