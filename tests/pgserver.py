"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` and ``pg_ctl`` in a temporary directory.

The server listens on a free port of 127.0.0.1 only, with its unix socket inside its own directory, trusts
local connections (nothing else can reach it), and is removed with its directory at :meth:`stop`. It never
uses a server that happens to be running.

``initdb`` refuses to run as root, so when the tests run as root the server runs as an unprivileged user:
``HUBBUB_TEST_PG_USER`` if set, else ``postgres`` (created by Debian's ``postgresql`` package), else
``nobody``; the directory is handed to that user. Binaries are found on ``PATH`` or in
``/usr/lib/postgresql/<version>/bin`` (Debian keeps them there). :func:`binaries` answers ``None`` when they
cannot be found, and callers skip with that reason.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["DatabasePool", "PgServer", "binaries", "missing_reason"]

_TOOLS = ("initdb", "pg_ctl", "postgres")


def binaries() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted(
        (Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for d in candidates:
        if all(os.access(d / t, os.X_OK) for t in _TOOLS):
            return d
    return None


def missing_reason() -> str | None:
    """Why no server can be started here (None: one can)."""
    if binaries() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found (apt-get install postgresql)"
    if os.geteuid() == 0 and _run_as() is None:
        return "running as root and no unprivileged user to run PostgreSQL as (set HUBBUB_TEST_PG_USER)"
    return None


def _run_as() -> pwd.struct_passwd | None:
    """The user the server runs as when we are root (None when we are not root or none is found)."""
    if os.geteuid() != 0:
        return None
    for name in (os.environ.get("HUBBUB_TEST_PG_USER", ""), "postgres", "nobody"):
        if not name:
            continue
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL server in a temporary directory (see the module docstring).

    ``settings``: extra ``postgres -c`` settings. ``url(dbname)``: a ``postgresql://`` URL for a database
    (create it with :meth:`create_database`). :meth:`stop` takes a ``mode`` (``fast``, ``immediate``: a
    crash, no shutdown checkpoint) and :meth:`start` starts the same server again on the same port.
    """

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        bindir = binaries()
        if bindir is None:
            raise RuntimeError(missing_reason() or "no PostgreSQL")
        self.bindir = bindir
        self.user = _run_as()
        # Short path: the unix socket's path must fit in 107 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="hubbub-pg-"))
        self.data = self.dir / "data"
        self.logfile = self.dir / "server.log"
        self.port = 0
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.dir),
            "max_connections": "100",
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
            **(settings or {}),
        }
        if self.user is not None:
            os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "hubbub", "--auth=trust", "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        user = self.user
        return subprocess.run(
            [str(self.bindir / tool), *args],
            check=check,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.dir,
            env={**os.environ, "LC_ALL": "C", "TZ": "UTC"},
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )

    def start(self, timeout: float = 60.0) -> PgServer:
        """Start the server (on the same port as before, if it ran before) and wait until it accepts."""
        for _ in range(5):
            if not self.port:
                self.port = _free_port()
            opts = " ".join(f"-c {k}={v}" for k, v in {**self.settings, "port": str(self.port)}.items())
            res = self._run(
                "pg_ctl", "start", "-w", "-t", str(int(timeout)),
                "-D", str(self.data), "-l", str(self.logfile), "-o", opts, check=False,
            )  # fmt: skip
            if res.returncode == 0:
                return self
            log = self.log()
            if "could not bind" in log or "already in use" in log:
                self.port = 0  # taken since we looked: another port
                continue
            raise RuntimeError(f"pg_ctl start failed: {res.stdout}{res.stderr}\n{log}")
        raise RuntimeError(f"pg_ctl start failed: no free port\n{self.log()}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (clean), ``immediate`` (no shutdown checkpoint, crash recovery at the
        next start)."""
        self._run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data), check=False)

    def kill(self) -> None:
        """``kill -9`` the postmaster (its backends exit when they notice)."""
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(pid_file.read_text().splitlines()[0])
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.02)

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://hubbub@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """Create database ``name`` and return its URL."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def end_sessions(self, name: str) -> None:
        """End every session on database ``name`` and wait until each has gone."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )

    def close(self) -> None:
        """Stop the server (immediately: nothing in it is kept) and remove its directory."""
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


#: What a database holds beside the system's own, by catalog: a database emptied for use again must count
#: what a new one does (and own and grant its ``public`` schema as initdb made it).
_FINGERPRINT = """
SELECT (SELECT count(*) FROM pg_class), (SELECT count(*) FROM pg_type), (SELECT count(*) FROM pg_proc),
       (SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_temp\\_%'
                                            AND nspname NOT LIKE 'pg\\_toast\\_temp\\_%'),
       (SELECT count(*) FROM pg_extension), (SELECT count(*) FROM pg_largeobject_metadata),
       (SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_event_trigger),
       (SELECT count(*) FROM pg_default_acl), (SELECT count(*) FROM pg_trigger),
       (SELECT count(*) FROM pg_db_role_setting WHERE setdatabase = (
            SELECT oid FROM pg_database WHERE datname = current_database())),
       (SELECT pg_get_userbyid(nspowner) || ' ' || coalesce(nspacl::text, '') FROM pg_namespace
         WHERE nspname = 'public')
"""


class DatabasePool:
    """Empty databases on one server, each for one user at a time (a test, or the tests of a module), and
    used again after it: a ``CREATE DATABASE`` copies the template through the WAL, a ``DROP DATABASE``
    forces a checkpoint, and the first sessions on a new database build its catalog caches; on the tests'
    shared server the three cost more CPU than most tests they serve.

    :meth:`take` gives a database under a new name: one given back, renamed (a process left over from its
    last user, still holding the old name's URL, cannot reach the new user's data), or a new one.
    :meth:`give_back` ends every session on it, drops every schema but the system's, creates ``public`` again
    as initdb made it, and keeps the database only when it then holds exactly what a new one did
    (:data:`_FINGERPRINT`); otherwise it drops it. Not thread-safe: one pool per process, used from the
    thread running the tests."""

    def __init__(self, server: PgServer) -> None:
        self.server = server
        self._free: list[str] = []
        self._new: tuple[object, ...] | None = None

    def take(self, name: str) -> str:
        """A database named ``name``, empty; its URL."""
        import psycopg

        while self._free:
            old = self._free.pop()
            self.server.end_sessions(old)
            try:
                with psycopg.connect(self.server.url(), autocommit=True) as conn:
                    conn.execute(f'ALTER DATABASE "{old}" RENAME TO "{name}"')
                return self.server.url(name)
            except psycopg.Error:  # a session came back in between: not this one
                self.server.drop_database(old)
        url = self.server.create_database(name)
        if self._new is None:
            with psycopg.connect(url, autocommit=True) as conn:
                self._new = tuple(conn.execute(_FINGERPRINT).fetchone() or ())
        return url

    def give_back(self, name: str) -> None:
        """Empty database ``name`` for the next :meth:`take`, or drop it."""
        import psycopg

        self.server.end_sessions(name)
        try:
            with psycopg.connect(self.server.url(name), autocommit=True) as conn:
                schemas = conn.execute(
                    "SELECT nspname FROM pg_namespace"
                    " WHERE nspname NOT IN ('pg_catalog', 'information_schema') AND nspname NOT LIKE 'pg\\_%'"
                ).fetchall()
                for (schema,) in schemas:
                    conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
                conn.execute("CREATE SCHEMA public AUTHORIZATION pg_database_owner")
                conn.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")
                kept = tuple(conn.execute(_FINGERPRINT).fetchone() or ()) == self._new
        except psycopg.Error:
            kept = False
        if kept:
            self._free.append(name)
        else:
            self.server.drop_database(name)
