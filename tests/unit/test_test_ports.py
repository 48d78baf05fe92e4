"""Every server a test starts listens on free ports only (tests/conftest.py moves the defaults): a server
left running on the fixed defaults (the README's tour leaves one), another test run or another worker of
this one must never make a test fail with "address already in use"."""

from __future__ import annotations

import os

from hubbub.config import Config, env_name, parse_listen
from hubbub.server_config import KEYS, load_config
from tests.conftest import REAL_LISTEN_DEFAULTS

#: Configuration keys that are a listener's address, on by default (one whose default is "" is off).
LISTENERS = sorted(key for key in KEYS if key.endswith("listen") and KEYS[key].default() != "")


def test_every_listener_key_is_moved_by_the_conftest() -> None:
    # A new listener's key (a dialect's too) must be declared with hubbub.config.listen_field, whose default
    # tests/conftest.py replaces (hubbub.config.LISTEN_OVERRIDE) and lists in REAL_LISTEN_DEFAULTS.
    assert sorted(REAL_LISTEN_DEFAULTS) == LISTENERS
    for key, real in REAL_LISTEN_DEFAULTS.items():
        assert parse_listen(real, key)[1] != 0, f"{key}: the shipped default is a fixed port"


def test_a_config_built_in_a_test_has_every_listener_on_port_0() -> None:
    """In process: a Config, or load_config with no listener given, as the tests build their servers."""
    for cfg in (Config(), load_config({"data_dir": "x"}, env={}), load_config({}, env=dict(os.environ))):
        for key in LISTENERS:
            value = KEYS[key].read(cfg)
            host, port = parse_listen(value, key)
            assert (host, port) == ("127.0.0.1", 0), f"{key} = {value}"


def test_a_hubbub_serve_child_inherits_port_0_for_every_listener() -> None:
    """Child processes (``hubbub serve`` started by a test) read their listeners from the environment."""
    for key in LISTENERS:
        assert parse_listen(os.environ[env_name(key)], key)[1] == 0, env_name(key)
