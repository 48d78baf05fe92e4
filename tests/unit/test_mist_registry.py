"""The mist token registry and authenticator (hubbub.auth.mist_registry): commands, persistence, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hubbub.auth.mist_registry import REGISTRY_FILE, MistAccess, MistAuthenticator, MistTokenRegistry
from hubbub.errors import StorageError


def test_commands_as_mist_md_7(tmp_path: Path) -> None:
    reg = MistTokenRegistry.in_data_dir(tmp_path / "data")
    assert reg.tags("tok") is None
    assert reg.register("tok", ["t1", "t2"])
    assert not reg.register("tok", ["t1"])  # "already exists": no change
    assert reg.tags("tok") == frozenset({"t1", "t2"})
    assert reg.set_tags("tok", ["t3"])
    assert reg.unset_tags("tok", ["t1", "nope"])
    assert reg.tags("tok") == frozenset({"t2", "t3"})
    assert not reg.set_tags("nope", ["x"]) and not reg.unset_tags("nope", ["x"])
    assert reg.unregister("tok")
    assert not reg.unregister("tok")
    assert reg.tags("tok") is None and len(reg) == 0


def test_every_change_is_on_disk_before_the_method_returns(tmp_path: Path) -> None:
    reg = MistTokenRegistry.in_data_dir(tmp_path)
    reg.register("b", ["y", "x"])
    reg.register("a", [])
    reg.register("é\ud800", ["ü"])  # any str survives the round trip
    doc = json.loads((tmp_path / REGISTRY_FILE).read_text())
    assert doc == {"format": 1, "tokens": {"a": [], "b": ["x", "y"], "é\ud800": ["ü"]}}
    again = MistTokenRegistry(tmp_path / REGISTRY_FILE)
    assert again.tokens() == reg.tokens()
    reg.unset_tags("b", ["x"])
    reg.unregister("a")
    assert MistTokenRegistry(tmp_path / REGISTRY_FILE).tokens() == {"b": {"y"}, "é\ud800": {"ü"}}


def test_no_op_changes_do_not_write(tmp_path: Path) -> None:
    reg = MistTokenRegistry.in_data_dir(tmp_path)
    reg.register("t", ["a"])
    before = (tmp_path / REGISTRY_FILE).stat().st_mtime_ns
    (tmp_path / REGISTRY_FILE).write_text((tmp_path / REGISTRY_FILE).read_text())  # a marker write
    marker = (tmp_path / REGISTRY_FILE).stat().st_mtime_ns
    assert reg.set_tags("t", ["a"]) and reg.unset_tags("t", ["b"])
    assert (tmp_path / REGISTRY_FILE).stat().st_mtime_ns == marker >= before


def test_stale_temporary_files_are_removed_at_load(tmp_path: Path) -> None:
    reg = MistTokenRegistry.in_data_dir(tmp_path)
    reg.register("t", ["a"])
    stale = tmp_path / f"{REGISTRY_FILE}.tmp-123-abcd"
    stale.write_text("{half")
    assert MistTokenRegistry(tmp_path / REGISTRY_FILE).tags("t") == frozenset({"a"})
    assert not stale.exists()


@pytest.mark.parametrize(
    "content",
    [b"{half", b"[]", b'{"format": 2, "tokens": {}}', b'{"format": 1, "tokens": {"t": "ab"}}', b"\xff"],
)
def test_a_malformed_file_is_refused(tmp_path: Path, content: bytes) -> None:
    (tmp_path / REGISTRY_FILE).write_bytes(content)
    with pytest.raises(StorageError):
        MistTokenRegistry(tmp_path / REGISTRY_FILE)


def test_a_failed_write_raises_and_changes_nothing(tmp_path: Path) -> None:
    reg = MistTokenRegistry.in_data_dir(tmp_path / "d")
    reg.register("keep", ["a"])
    shutil.rmtree(tmp_path / "d")  # the directory is gone: the next write cannot happen
    with pytest.raises(StorageError):
        reg.register("new", ["b"])
    with pytest.raises(StorageError):
        reg.set_tags("keep", ["c"])
    with pytest.raises(StorageError):
        reg.unregister("keep")
    assert reg.tokens() == {"keep": {"a"}}


def test_authenticator_sources_in_order(tmp_path: Path) -> None:
    reg = MistTokenRegistry.in_data_dir(tmp_path)
    reg.register("reg", ["a", "b"])
    reg.register("empty", [])
    auth = MistAuthenticator(
        master_token="master",
        verify_global=lambda t: "alice" if t == "static" else None,
        registry=reg,
    )
    assert auth.check("master") == MistAccess()
    assert auth.check("static") == MistAccess("alice")
    assert auth.check("reg") is None  # registry tokens only where the route allows them
    assert auth.check("reg", allow_registry=True) == MistAccess("", frozenset({"a", "b"}))
    assert auth.check("empty", allow_registry=True) is None  # a registry token needs a tag
    assert auth.check("", allow_registry=True) is None
    assert auth.check("nope", allow_registry=True) is None
    assert MistAuthenticator().check("master") is None  # no master token set: "" never matches


def test_two_registries_on_one_file_see_and_keep_each_others_changes(tmp_path: Path) -> None:
    """Two processes serving one data directory (the workers of a node) each hold a registry of the file: a
    change through one is read by the other, and a change through the other keeps it."""
    a = MistTokenRegistry.in_data_dir(tmp_path)
    b = MistTokenRegistry.in_data_dir(tmp_path)
    assert a.register("tok", ["red"])
    assert b.tags("tok") == frozenset({"red"})
    assert not b.register("tok", ["blue"])  # exists already, through a
    assert b.register("other", ["green"])
    assert a.set_tags("tok", ["x"])
    assert b.tokens() == a.tokens() == {"tok": {"red", "x"}, "other": {"green"}}
    assert MistTokenRegistry.in_data_dir(tmp_path).tokens() == {"tok": {"red", "x"}, "other": {"green"}}
