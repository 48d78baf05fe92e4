"""The README tour, run for real: ``hubbub serve`` plus ``pub``/``sub``/``log`` as separate processes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from .serverproc import ServerProcess

SRC = str(Path(__file__).resolve().parents[2] / "src")


def hubbub(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "hubbub", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        yield srv
    finally:
        srv.kill()


def test_version_and_help() -> None:
    out = hubbub("--version")
    assert out.returncode == 0 and out.stdout.startswith("hubbub ")
    helptext = hubbub("serve", "--help").stdout
    for flag in ("--durability", "--data-dir", "--http-listen", "--limits-max-frame", "HUBBUB_DURABILITY"):
        assert flag in helptext
    for cmd in ("serve", "pub", "sub", "log"):
        assert cmd in hubbub("--help").stdout


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    out = hubbub("serve", "--data-dir", str(tmp_path), "--durability", "sometimes")
    assert out.returncode == 2
    assert "durability" in out.stderr


def test_a_second_server_on_the_same_data_dir_says_so_in_one_line(server: ServerProcess) -> None:
    out = hubbub(
        "serve", "--data-dir", str(server.data_dir), "--http-listen", "127.0.0.1:0",
        "--native-tcp-listen", "127.0.0.1:0", "--mist-tcp-listen", "127.0.0.1:0",
        "--qpubs-qrpc-listen", "127.0.0.1:0",
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"hubbub serve: data_dir {server.data_dir} is in use by another hubbub serve "
        "(every node needs its own data_dir)"
    ]
    assert server.alive  # and the first one serves on
    # Two data directories on one SQLite file: the log's own lock says so, in one line too.
    db = f"sqlite:///{server.data_dir.parent / 'shared.db'}"
    first = ServerProcess(server.data_dir.parent / "one", ["--store", db]).start()
    try:
        out = hubbub(
            "serve", "--data-dir", str(server.data_dir.parent / "two"), "--store", db,
            "--http-listen", "127.0.0.1:0", "--native-tcp-listen", "127.0.0.1:0",
            "--mist-tcp-listen", "127.0.0.1:0", "--qpubs-qrpc-listen", "127.0.0.1:0",
        )  # fmt: skip
    finally:
        first.kill()
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"hubbub serve: cannot open the log (file {db[len('sqlite://') :]}): log database is in use by "
        "another store (another hubbub serve on it?)"
    ]


def test_a_misspelt_environment_variable_stops_the_server(tmp_path: Path) -> None:
    typo = "HUBBUB_" + "DURABILTY"  # in two parts: tests/unit/test_docs_reference.py scans for HUBBUB_ names
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **{typo: "fsync"})
    out = subprocess.run(
        [sys.executable, "-m", "hubbub", "serve", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=30, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    hint = "(did you mean HUBBUB_DURABILITY?)"
    assert out.stderr == f"hubbub serve: unknown environment variable {typo} {hint}\n"
    assert not any(tmp_path.iterdir())  # it stopped before opening anything


def test_sub_since_replays_exactly_the_missed_events(server: ServerProcess) -> None:
    url = f"ws://127.0.0.1:{server.ports['http']}"
    acks = []
    for i in range(1, 3):
        r = hubbub("pub", "/tour/room", f"m{i}", "--url", url, "--output", "json")
        assert r.returncode == 0, r.stderr
        acks.append(json.loads(r.stdout))
    seen = hubbub("sub", "/tour/room", "--url", url, "--last", "2", "--count", "2", "--output", "json")
    assert [json.loads(line)["text"] for line in seen.stdout.splitlines()] == ["m1", "m2"]
    # The subscriber is gone; three more events happen meanwhile.
    for i in range(3, 6):
        assert hubbub("pub", "/tour/room", f"m{i}", "--url", url).returncode == 0
    last = acks[-1]
    since = f"{last['seq']}:{last['epoch']}"
    back = hubbub("sub", "/tour/room", "--url", url, "--since", since, "--count", "3", "--output", "json")
    assert back.returncode == 0, back.stderr
    events = [json.loads(line) for line in back.stdout.splitlines()]
    assert [(e["seq"], e["text"]) for e in events] == [(3, "m3"), (4, "m4"), (5, "m5")]
    log = hubbub("log", "/tour/room", "--url", url)
    assert log.returncode == 0
    assert [line.split(" ", 2)[2] for line in log.stdout.splitlines()] == ["m1", "m2", "m3", "m4", "m5"]


#: (content type, payload, how the text output shows it): one event per line whatever the payload holds.
SHOWN = [
    (
        "text/plain; charset=utf-8",
        b"two\nlines\r\tand a NUL \x00 and \\ itself",
        r"two\nlines\r\tand a NUL \x00 and \\ itself",
    ),
    (
        "text/plain; charset=utf-8",
        "next line \u0085, line separator \u2028".encode(),
        r"next line \u0085, line separator \u2028",
    ),
    ("application/octet-stream", b"\x89PNG\r\n\x1a\n\x00\xff", r"\x89PNG\r\n\x1a\n\x00\xff"),
    ("application/json", b'{"a": [1, "x\\ny"],\n "b": null}', r'{"a":[1,"x\ny"],"b":null}'),
    (
        "application/msgpack",
        msgpack.packb([1, "a\nb", b"\x00\x01", {"k": 2}]),
        r'msgpack:[1,"a\nb",{"b64":"AAE="},{"k":2}]',
    ),
    ("application/msgpack", b"\xc1", r"\xc1"),  # not msgpack after all: its bytes
]


def test_sub_and_log_print_every_payload_on_one_line(server: ServerProcess) -> None:
    base = f"http://127.0.0.1:{server.ports['http']}"
    for ctype, payload, _ in SHOWN:
        req = urllib.request.Request(
            f"{base}/api/v1/publish/show", data=payload, headers={"Content-Type": ctype}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
    want = [f"/show {seq} {shown}" for seq, (_, _, shown) in enumerate(SHOWN, 1)]
    n = str(len(SHOWN))
    log = hubbub("log", "/show", "--url", base)
    assert log.returncode == 0, log.stderr
    assert log.stdout.split("\n") == [*want, ""]
    sub = hubbub("sub", "/show", "--url", base.replace("http", "ws"), "--last", n, "--count", n)
    assert sub.returncode == 0, sub.stderr
    assert sub.stdout.split("\n") == [*want, ""]
    # --output json is the native event object, as before: the payload exactly, with its content type.
    raw = hubbub("log", "/show", "--url", base, "--output", "json")
    events = [json.loads(line) for line in raw.stdout.split("\n") if line]  # JSON lines: split at \n only
    assert [e["content_type"] for e in events] == [ctype for ctype, _, _ in SHOWN]
    assert events[0]["text"] == SHOWN[0][1].decode()
    assert base64.b64decode(events[2]["b64"]) == SHOWN[2][1]


def test_serve_raises_its_open_files_limit_to_the_hard_limit(tmp_path: Path) -> None:
    """Every connection is a file descriptor: a server started under the usual soft limit (1024, systemd's
    default) would refuse connections past about a thousand while the hard limit allows far more."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, hard)
    if low == hard:
        pytest.skip("the hard limit leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))  # inherited by the server only
    try:
        srv = ServerProcess(tmp_path / "data")
        srv.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert srv.proc is not None
        with open(f"/proc/{srv.proc.pid}/limits") as f:
            line = next(ln for ln in f if ln.startswith("Max open files"))
        assert line.split()[3:5] == [str(hard), str(hard)], line
        assert f"open files raised from {low} to the hard limit {hard}" in srv.log()
    finally:
        srv.kill()
