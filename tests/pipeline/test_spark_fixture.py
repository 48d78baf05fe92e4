"""The Spark tests' shared session (conftest ``spark``): a test that leaves it unusable, as a timeout
inside a Spark call does, does not fail every later test on its worker."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from .conftest import SparkSessions

pytestmark = pytest.mark.spark


def test_a_session_left_unusable_is_replaced_before_the_next_test(
    spark: SparkSession, spark_sessions: SparkSessions
) -> None:
    assert spark_sessions.healthy() is spark  # one that answers is kept
    recreated = spark_sessions.recreated
    spark.stop()
    again = spark_sessions.healthy()
    assert again is not spark and spark_sessions.recreated == recreated + 1
    assert again.range(5).count() == 5
    assert spark_sessions.healthy() is again
