"""Every server a test starts listens on free ports only (tests/conftest.py moves the defaults): a server
left running on the fixed defaults (the README's tour leaves one), another test run or another worker of
this one must never make a test fail with "address already in use"."""

from __future__ import annotations

import os

from hubbub.config import KEYS, Config, env_name, load_config, parse_listen
from tests.conftest import REAL_LISTEN_DEFAULTS

#: Configuration keys that are a listener's address.
LISTENERS = sorted(key for key in KEYS if key.endswith("listen"))


def test_every_listener_key_is_moved_by_the_conftest() -> None:
    # A new listener's key must be added to REAL_LISTEN_DEFAULTS, with its default a module value of
    # hubbub.config that tests/conftest.py replaces (as DEFAULT_HTTP_LISTEN).
    assert sorted(REAL_LISTEN_DEFAULTS) == LISTENERS
    for key, real in REAL_LISTEN_DEFAULTS.items():
        assert parse_listen(real, key)[1] != 0, f"{key}: the shipped default is a fixed port"


def test_a_config_built_in_a_test_has_every_listener_on_port_0() -> None:
    """In process: a Config, or load_config with no listener given, as the tests build their servers."""
    for cfg in (Config(), load_config({"data_dir": "x"}, env={}), load_config({}, env=dict(os.environ))):
        for key in LISTENERS:
            attr = KEYS[key][0][0]
            host, port = parse_listen(getattr(cfg, attr), key)
            assert (host, port) == ("127.0.0.1", 0), f"{key} = {getattr(cfg, attr)}"


def test_a_hubbub_serve_child_inherits_port_0_for_every_listener() -> None:
    """Child processes (``hubbub serve`` started by a test) read their listeners from the environment."""
    for key in LISTENERS:
        assert parse_listen(os.environ[env_name(key)], key)[1] == 0, env_name(key)
