"""Mist's token registry (protocols/mist.md §7) and mist authentication (§8).

:class:`MistTokenRegistry` maps tokens to tag sets, serves the registry commands of both mist generations
(``register``, ``unregister``, ``set``, ``unset``, ``tags``) and keeps them in ``data_dir/mist-tokens.json``.
Every change is written before the method returns: to a temporary file in the same directory, fsync'd,
renamed over the file, and the directory fsync'd. A crash at any point (kill -9 included) leaves either the
previous file or the new one, never a torn one, and a change whose method returned survives.

:class:`MistAuthenticator` decides which tokens mist accepts when ``mist.auth = token``: ``mist.token`` (the
extra master token), the global tokens (static tokens and JWTs, through the ``verify_global`` callable the
composition root passes in, so this module stays independent of how those are verified), and, where the
route allows it (the 2015 WebSocket), a registry token with at least one tag.

The file is the registry of every process serving the data directory (the workers of ``hubbub serve
--workers N``, docs/operations.md "Workers"): a change holds an exclusive ``flock`` on
``mist-tokens.json.lock`` while it re-reads the file, changes it and writes it, so changes made by two
processes at once are both kept, and a read notices that another process replaced the file (its inode, size
or time changed: every write is a rename) and reads it again. A token registered through one worker is
accepted by every other at its next login.

Concurrency contract: both classes are thread-safe (one lock per registry, and the file lock between
processes). The registry's mutating methods write and fsync a file, so the server calls them off the event
loop (as it does the log). Reads (:meth:`MistTokenRegistry.tags`, :meth:`MistAuthenticator.check`) read
memory after one ``stat`` of the file, and re-read the small file only when another process changed it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import json
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hubbub.errors import StorageError

__all__ = ["REGISTRY_FILE", "MistAccess", "MistAuthenticator", "MistTokenRegistry"]

#: The registry's file name inside ``data_dir`` (protocols README §2, mist.md §7).
REGISTRY_FILE: Final = "mist-tokens.json"
_FORMAT: Final = 1
_TMP_MARK: Final = ".tmp-"
_LOCK_SUFFIX: Final = ".lock"

#: What identifies one version of the file: its inode, size and modification time (None: no file).
_Stamp = tuple[int, int, int] | None


class MistTokenRegistry:
    """Token → tag set, persisted in one JSON file (see the module docstring).

    The file holds ``{"format": 1, "tokens": {"<token>": ["<tag>", …], …}}`` with tokens and tags sorted.
    A missing file is an empty registry; an unreadable or malformed one raises
    :class:`~hubbub.errors.StorageError` (the server refuses to start rather than forget tokens).
    A failed write also raises :class:`~hubbub.errors.StorageError`, and the change is undone in memory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: _Stamp = None
        with self._lock, self._file_lock():
            # Temporary files of writes cut short by a crash hold nothing the real file lacks: remove them
            # (under the file lock: no other process is writing one now).
            for stale in self.path.parent.glob(f"{self.path.name}{_TMP_MARK}*"):
                with contextlib.suppress(OSError):
                    stale.unlink()
            self._tokens: dict[str, frozenset[str]] = self._load()

    @classmethod
    def in_data_dir(cls, data_dir: str | os.PathLike[str]) -> MistTokenRegistry:
        """The registry of a server whose ``data_dir`` is given (the directory is created if missing)."""
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        return cls(Path(data_dir) / REGISTRY_FILE)

    # -- reads ----------------------------------------------------------------------------------------------

    def tags(self, token: str) -> frozenset[str] | None:
        """The tags of ``token`` (possibly empty), or None when it is not registered."""
        return self._current().get(token)

    def __contains__(self, token: object) -> bool:
        return token in self._current()

    def __len__(self) -> int:
        return len(self._current())

    def tokens(self) -> dict[str, frozenset[str]]:
        """A copy of the whole registry."""
        return dict(self._current())

    def _current(self) -> dict[str, frozenset[str]]:
        """The tokens, read again first when another process replaced the file since this one last did (a
        file gone is no process's change: a write never removes it)."""
        stamp = _stamp_of(self.path)
        if stamp is not None and stamp != self._stamp:
            with self._lock:
                if _stamp_of(self.path) not in (None, self._stamp):
                    # A file this process did not write and cannot read: keep what it had.
                    with contextlib.suppress(StorageError):
                        self._tokens = self._load()
        return self._tokens

    # -- the registry commands (mist.md §2, §4) -------------------------------------------------------------

    def register(self, token: str, tags: Iterable[str]) -> bool:
        """Create ``token`` with ``tags``. False (and no change) when it exists already."""
        with self._changing():
            if token in self._tokens:
                return False
            return self._change(token, frozenset(tags))

    def unregister(self, token: str) -> bool:
        """Forget ``token``. False when it was not registered (upstream ignores that)."""
        with self._changing():
            if token not in self._tokens:
                return False
            return self._change(token, None)

    def set_tags(self, token: str, tags: Iterable[str]) -> bool:
        """Add ``tags`` to ``token``. False when the token is not registered."""
        with self._changing():
            have = self._tokens.get(token)
            if have is None:
                return False
            new = have | frozenset(tags)
            return new == have or self._change(token, new)

    def unset_tags(self, token: str, tags: Iterable[str]) -> bool:
        """Remove ``tags`` from ``token``. False when the token is not registered."""
        with self._changing():
            have = self._tokens.get(token)
            if have is None:
                return False
            new = have - frozenset(tags)
            return new == have or self._change(token, new)

    # -- persistence ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Hold both locks for a change, with the tokens as the file holds them now (another process may
        have changed it)."""
        with self._lock, self._file_lock():
            if _stamp_of(self.path) not in (None, self._stamp):
                self._tokens = self._load()
            yield

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """An exclusive ``flock`` on the lock file beside the registry, for the processes sharing it."""
        try:
            fd = os.open(f"{self.path}{_LOCK_SUFFIX}", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError("the mist token registry cannot be locked") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _change(self, token: str, tags: frozenset[str] | None) -> bool:
        """Apply one change and persist it; undo it in memory if the write fails. Holds the lock."""
        old = self._tokens.get(token)
        if tags is None:
            del self._tokens[token]
        else:
            self._tokens[token] = tags
        try:
            self._save()
        except OSError as exc:
            if old is None:
                self._tokens.pop(token, None)
            else:
                self._tokens[token] = old
            raise StorageError("the mist token registry cannot be written") from exc
        return True

    def _save(self) -> None:
        doc = {"format": _FORMAT, "tokens": {t: sorted(v) for t, v in sorted(self._tokens.items())}}
        # ASCII with \u escapes: any str (a lone surrogate included) can be written and read back.
        data = json.dumps(doc, indent=1).encode() + b"\n"
        directory = self.path.parent
        tmp = directory / f"{self.path.name}{_TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._stamp = _stamp_of(self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        # The rename is durable only once the directory entry is: fsync the directory too.
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _load(self) -> dict[str, frozenset[str]]:
        """The file's tokens; notes the version read (``_stamp``) once it is read whole and valid."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                raw = f.read()
        except FileNotFoundError:
            self._stamp = None
            return {}
        except OSError as exc:
            raise StorageError(f"cannot read {self.path.name}") from exc
        try:
            doc = json.loads(raw)
            tokens = doc["tokens"]
            if doc.get("format") != _FORMAT or not isinstance(tokens, dict):
                raise ValueError("unknown format")
            out: dict[str, frozenset[str]] = {}
            for token, tags in tokens.items():
                if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
                    raise ValueError("tags must be lists of strings")
                out[token] = frozenset(tags)
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"{self.path.name} is not a mist token registry") from exc
        self._stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        return out


def _stamp_of(path: Path) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class MistAccess:
    """An accepted mist token. ``registry_tags`` is set when the token was accepted as a registry token (its
    tags, never empty): a 2015 WebSocket subscribe must then share a tag with it (mist.md §8)."""

    user: str = ""
    registry_tags: frozenset[str] | None = None


class MistAuthenticator:
    """Which tokens mist accepts with ``mist.auth = token`` (mist.md §8).

    ``master_token`` is ``mist.token`` ("" for none). ``verify_global`` checks a global token (static or
    JWT, README §6) and returns its user, or None when the token is not valid. ``registry`` is the token
    registry, consulted only when the caller allows registry tokens.
    """

    def __init__(
        self,
        *,
        master_token: str = "",
        verify_global: Callable[[str], str | None] | None = None,
        registry: MistTokenRegistry | None = None,
    ) -> None:
        self._master = master_token.encode("utf-8", "surrogatepass")
        self._verify_global = verify_global
        self.registry = registry

    def check(self, token: str, *, allow_registry: bool = False) -> MistAccess | None:
        """The access ``token`` gives, or None when it is refused. ``allow_registry`` is for the 2015
        WebSocket route, where a registry token with at least one tag is also accepted."""
        if not token:
            return None
        if self._master and hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self._master):
            return MistAccess()
        if self._verify_global is not None:
            user = self._verify_global(token)
            if user is not None:
                return MistAccess(user)
        if allow_registry and self.registry is not None:
            tags = self.registry.tags(token)
            if tags:
                return MistAccess("", tags)
        return None
