"""Every case of every conformance-vector file, each against a fresh server (``tests/conformance/runner.py``).

A case runs only when its own file's dialect and every dialect its steps touch are in
``IMPLEMENTED_DIALECTS``; the others are skipped with the list of what is missing. Each dialect's work adds
its name to the set.

Every case runs twice: against a ``Server`` in the test's process, and against ``hubbub serve --workers 2``
(a parent and two worker processes sharing the listeners' ports, a fresh node on a fresh data directory per
case), which must behave as one server whichever worker the kernel gives each connection; the cases of
:data:`WORKERS_GAPS` are expected to fail there when their connections are split. Each node is forked from
the test process's launcher, which has imported hubbub once (``tests/nodelauncher.py``), and forks its
workers from its fork server (``hubbub/workers/forkserver.py``): a case's node costs about 0.15 s of CPU
(three new interpreters took 1.8 s). ``HUBBUB_VECTORS_WORKERS`` (:data:`WORKERS_RUN`) picks which cases
run the second way: ``all`` (the default), ``sample`` (one in five), ``none``.

The vectors are read from ``$HUBBUB_VECTORS_DIR`` if set, else from ``shared/protocols/vectors`` beside the
repository (where the specs are provided, and where CI puts them). Not finding them is a failure in CI (``CI``
set) and where ``HUBBUB_VECTORS_DIR`` names them; elsewhere (a checkout on its own) ``test_vectors_found``
skips with where they come from.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Final

import pytest

from .runner import DIALECTS, REQUIREMENTS, CaseFailure, HasPorts, dialects_touched, run_case

IMPLEMENTED_DIALECTS: set[str] = {"native", "ivy", "guble", "wearscript", "mist", "qpubs", "mqtt"}

_REPO = Path(__file__).resolve().parents[2]
_CANDIDATES = (_REPO.parent / "shared" / "protocols" / "vectors",)
# Listener keys the runner binds to port 0 when the configuration knows them (dialects arrive one by one).
_TCP_LISTEN_KEYS = ("native.tcp_listen", "mist.tcp_listen", "qpubs.qrpc_listen", "mqtt.tcp_listen")
#: Vectors kept with the tests, in the same format, for dialects the shared directory has no file of (MQTT).
LOCAL_VECTORS = Path(__file__).resolve().parent / "vectors"


def vectors_dir() -> Path | None:
    env = os.environ.get("HUBBUB_VECTORS_DIR")
    if env:
        return Path(env)
    return next((p for p in _CANDIDATES if (p / "native.json").is_file()), None)


def load_cases() -> list[tuple[str, dict[str, Any]]]:
    """(file dialect, case) for every case of every vector file found: the shared directory's, and for a
    dialect it has no file of, :data:`LOCAL_VECTORS`'s."""
    root = vectors_dir()
    out: list[tuple[str, dict[str, Any]]] = []
    for dialect in DIALECTS:
        path = root / f"{dialect}.json" if root is not None else None
        if path is None or not path.is_file():
            path = LOCAL_VECTORS / f"{dialect}.json"
        if path.is_file():
            out.extend((dialect, case) for case in json.loads(path.read_text(encoding="utf-8")))
    return out


CASES = load_cases()


def server_factory(
    data_dir: Path, overrides: Mapping[str, Any], workers: int = 1
) -> Callable[[], AbstractAsyncContextManager[HasPorts]]:
    """A fresh ``Server`` on ``data_dir`` per call (the runner calls it again on restart), loopback port 0;
    with ``workers`` above 1, a fresh ``hubbub serve --workers N`` process (:class:`WorkerNodeProcess`)."""
    if workers > 1:
        return lambda: WorkerNodeProcess(data_dir, overrides, workers)
    # Imported here, not at the top: collection (and the skips) must work while the server is half-built.
    from hubbub.server import Server
    from hubbub.server_config import KEYS, load_config

    cli: dict[str, Any] = {"data_dir": str(data_dir), "http.listen": "127.0.0.1:0"}
    cli.update({key: "127.0.0.1:0" for key in _TCP_LISTEN_KEYS if key in KEYS})
    cli.update(overrides)
    config = load_config(cli=cli, env={})

    def start() -> AbstractAsyncContextManager[HasPorts]:
        server: AbstractAsyncContextManager[HasPorts] = Server(config)
        return server

    return start


class WorkerNodeProcess:
    """``hubbub serve --workers N`` on ``data_dir`` as an async context manager with ``ports``: entering
    starts the node (a parent and N workers sharing every listener's port; the parent forked from the test
    process's launcher, ``tests/nodelauncher.py``), leaving stops it with SIGTERM (each worker closes its
    connections with 1001, as ``Server`` does). ``overrides`` become command-line options."""

    def __init__(self, data_dir: Path, overrides: Mapping[str, Any], workers: int) -> None:
        from tests.integration.serverproc import ServerProcess
        from tests.nodelauncher import launcher

        args = ["--workers", str(workers)]
        for key, value in overrides.items():
            text = json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value)
            args += ["--" + key.replace(".", "-").replace("_", "-"), text]
        self._proc = ServerProcess(data_dir, args, launcher=launcher())

    @property
    def ports(self) -> Mapping[str, int]:
        return self._proc.ports

    async def __aenter__(self) -> WorkerNodeProcess:
        await asyncio.to_thread(self._proc.start, 60.0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        status = await asyncio.to_thread(self._proc.terminate, 30.0)
        assert status == 0, f"the node exited with {status}:\n{self._proc.log()}"


#: Cases a ``--workers 2`` node fails when their connections land on different workers (docs/operations.md
#: "Workers", limits of this version), each with the reason; not strict, as they pass when the kernel puts
#: every connection on one worker. None now: rosters, WearScript's device lists, qpubs' ``delivered`` and the
#: connection limits are the node's (tests/integration/test_workers_shared.py places connections on both
#: workers to check each).
WORKERS_GAPS: Final[dict[str, str]] = {}

#: Cases a ``--workers 2`` node fails now and then through a race between its workers (non-strict xfail).
#: None now: a subscription on a worker behind the log (guble's ``+ /foo -1`` after a publish on
#: ``/foo/bar`` acknowledged by the other worker) waits for the worker's relay to have every event
#: committed before it (``WorkerRelay.barrier``), so no event acknowledged before it comes to it live.
WORKERS_RACES: Final[dict[str, str]] = {}


def skip_reason(dialect: str, case: Mapping[str, Any]) -> str | None:
    missing = ({dialect} | dialects_touched(case)) - IMPLEMENTED_DIALECTS
    if missing:
        return f"needs dialects not yet served: {', '.join(sorted(missing))}"
    unsupported = set(case.get("requires", [])) - REQUIREMENTS
    if unsupported:
        return f"needs runner capabilities: {', '.join(sorted(unsupported))}"
    return None


#: Which cases also run against the two-worker node: ``HUBBUB_VECTORS_WORKERS=all`` (the default) every one,
#: ``sample`` every :data:`WORKERS_SAMPLE`-th case of each dialect's files, ``none`` none (any other value is
#: an error). ``test_runner_restart`` runs against both always.
WORKERS_RUN: Final = os.environ.get("HUBBUB_VECTORS_WORKERS", "") or "all"
WORKERS_SAMPLE: Final = 5
if WORKERS_RUN not in ("all", "sample", "none"):
    raise ValueError(f"HUBBUB_VECTORS_WORKERS={WORKERS_RUN!r}: expected all, sample or none")


def vector_params() -> list[Any]:
    """Each case once against one process, and those :data:`WORKERS_RUN` asks for against two workers."""
    single = [pytest.param(1, d, c, id=f"single-{c['id']}") for d, c in CASES]
    seen: dict[str, int] = {}
    workers = []
    for d, c in CASES:
        n = seen[d] = seen.get(d, -1) + 1
        if WORKERS_RUN == "all" or (WORKERS_RUN == "sample" and n % WORKERS_SAMPLE == 0):
            workers.append(pytest.param(2, d, c, id=f"workers2-{c['id']}"))
    return single + workers


@pytest.mark.parametrize(("workers", "dialect", "case"), vector_params())
def test_vector(
    dialect: str, case: dict[str, Any], workers: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    reason = skip_reason(dialect, case)
    if reason:
        pytest.skip(reason)
    gap = (WORKERS_GAPS.get(case["id"]) or WORKERS_RACES.get(case["id"])) if workers > 1 else None
    if gap is not None:
        request.applymarker(pytest.mark.xfail(reason=gap, strict=False))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    start = server_factory(data_dir, case.get("config", {}), workers)
    failure: str | None = None
    try:
        asyncio.run(run_case(case, start))
    except CaseFailure as exc:
        if exc.__cause__ is not None:  # a server that did not start or stop cleanly: keep its traceback
            raise
        failure = str(exc)
    if failure is not None:  # the message names the step and what came; a traceback would only add noise
        pytest.fail(failure, pytrace=False)


#: Why the vectors were not found, and where they come from (the README says the same).
NO_VECTORS = (
    "no conformance vectors: they are read from ../shared/protocols/vectors beside the repository, "
    "or from the directory HUBBUB_VECTORS_DIR names"
)


def test_vectors_found() -> None:
    """Guard against silently running nothing: the vector files must be found, with unique case ids. A
    checkout without them beside it skips, with the reason; CI, which puts them there, fails."""
    if vectors_dir() is None:
        if os.environ.get("CI"):
            pytest.fail(NO_VECTORS)
        pytest.skip(NO_VECTORS)
    ids = [case["id"] for _, case in CASES]
    assert ids, "the vector directory holds no cases"
    assert len(ids) == len(set(ids)), "case ids must be unique across files"
    for dialect, case in CASES:
        assert case["id"].startswith(f"{dialect}."), f"{case['id']} is in {dialect}.json"


@pytest.mark.parametrize(("ci", "outcome"), [(None, pytest.skip.Exception), ("true", pytest.fail.Exception)])
def test_missing_vectors_skip_outside_ci_and_fail_in_it(
    ci: str | None, outcome: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(globals(), "vectors_dir", lambda: None)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match=r"\.\./shared/protocols/vectors .* HUBBUB_VECTORS_DIR"):
        test_vectors_found()


# No shared vector restarts the server yet, so this inline native case keeps the runner's `server` step
# honest: open clients see the shutdown, the new server's ports are used, and an acknowledged event survives.
RESTART_CASE: dict[str, Any] = {
    "id": "native.runner-restart",
    "describe": "The restart step: clients see the close and reconnect on the new ports; the log survives.",
    "requires": ["restart"],
    "steps": [
        {"client": "A", "connect": "ws:/ws/hubbub", "subprotocols": ["hubbub.v1.json"]},
        {"client": "A", "send_json": {"op": "hello", "id": 1, "v": 1}},
        {"client": "A", "expect_json": {"op": "reply", "id": 1}, "match": "subset"},
        {
            "http": "POST /api/v1/publish/r",
            "send_body": "kept",
            "status": 200,
            "expect_json": {"channel": "/r", "seq": "{{INT:seq}}", "epoch": "{{EPOCH:e}}", "time": "{{NS}}"},
        },
        {"server": "restart"},
        {"client": "A", "expect_close": 1001},
        {
            "http": "GET /api/v1/log/r",
            "status": 200,
            "match": "subset",
            "expect_json": {
                "epoch": "{{$e}}",
                "top": "{{$seq}}",
                "events": [{"seq": "{{$seq}}", "text": "kept"}],
            },
        },
        {"client": "A", "connect": "ws:/ws/hubbub", "subprotocols": ["hubbub.v1.json"]},
        {"client": "A", "send_json": {"op": "hello", "id": 1, "v": 1}},
        {"client": "A", "expect_json": {"op": "reply", "id": 1}, "match": "subset"},
        {"client": "A", "send_json": {"op": "ping", "id": "{{$seq}}"}},
        {"client": "A", "expect_json": {"op": "pong", "id": "{{$seq}}"}},
    ],
    "expect": [{"all": "quiet", "within_ms": 100}],
}


@pytest.mark.parametrize("workers", [1, 2], ids=["single", "workers2"])
def test_runner_restart(workers: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    test_vector("native", RESTART_CASE, workers, tmp_path, request)
