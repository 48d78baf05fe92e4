"""The Spark settings ``hubbub pipeline`` starts a job's session with (no Spark needed)."""

from __future__ import annotations

from hubbub.pipeline.cli import BACKFILL_JVM_OPTIONS, job_conf

JVM = "spark.driver.extraJavaOptions"


def test_a_local_backfill_runs_on_the_c1_compiler_only() -> None:
    assert job_conf("backfill", "local[2]", {}) == {JVM: BACKFILL_JVM_OPTIONS}
    assert job_conf("backfill", "local[*]", {"a": "b"}) == {"a": "b", JVM: BACKFILL_JVM_OPTIONS}


def test_the_users_jvm_options_the_other_jobs_and_clusters_are_left_alone() -> None:
    assert job_conf("backfill", "local[2]", {JVM: "-Xmx2g"}) == {JVM: "-Xmx2g"}
    assert job_conf("backfill", "spark://h:7077", {}) == {}
    for job in ("archive", "stats", "audit", "compact", "export"):
        assert job_conf(job, "local[2]", {"a": "b"}) == {"a": "b"}
