"""Configuration by section (hubbub.config): a dialect brings its section with its spec, and the loader, the
flags, the environment names and the checks follow from it without an edit of hubbub.config."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest

import hubbub.config
from hubbub.cli import HELP, build_parser
from hubbub.config import (
    Config,
    ConfigError,
    DialectSection,
    Secret,
    config_keys,
    env_name,
    flag_name,
    listen_field,
    load_config,
    parse_listen,
)
from hubbub.dialects.registry import SPECS
from hubbub.dialects.spec import DialectSpec
from hubbub.server_config import DIALECT_SECTIONS, KEYS
from hubbub.transports.dialects import BINDINGS


@dataclass(frozen=True, slots=True)
class AcmeConfig(DialectSection):
    """A dialect's section as a new dialect writes it, in its own module."""

    SECTION: ClassVar[str] = "acme"
    HELP: ClassVar[Mapping[str, str]] = {"ws_path": "the path of acme's WebSocket route"}
    enabled: bool = True
    tcp_listen: str = listen_field("127.0.0.1:1883")
    tls_listen: str = listen_field("")  # off unless configured
    ws_path: str = "/acme"
    keepalive_s: float = 60.0
    topics: tuple[str, ...] = ()
    auth: str = ""
    token: Secret = field(default_factory=lambda: Secret(""))

    def validate(self, config: Config) -> None:
        DialectSection.validate(self, config)
        parse_listen(self.tcp_listen, "acme.tcp_listen")
        if self.tls_listen:
            if not config.tls.cert:
                raise ConfigError("acme.tls_listen: needs tls.cert and tls.key")
            parse_listen(self.tls_listen, "acme.tls_listen")
        if not self.ws_path.startswith("/"):
            raise ConfigError("acme.ws_path: must be a path from /")


def test_a_dialect_section_gives_its_keys_flags_and_variables(tmp_path: Path) -> None:
    keys = config_keys([AcmeConfig])
    acme = [k for k in keys if k.startswith("acme.")]
    assert acme == [
        "acme.enabled",
        "acme.tcp_listen",
        "acme.tls_listen",
        "acme.ws_path",
        "acme.keepalive_s",
        "acme.topics",
        "acme.auth",
        "acme.token",
    ]
    # Variables are written in two parts: tests/unit/test_docs_reference.py fails on a HUBBUB_ name it does
    # not know, and acme's keys are this test's only.
    assert flag_name("acme.ws_path") == "--acme-ws-path"
    assert env_name("acme.ws_path") == "HUBBUB_" + "ACME_WS_PATH"
    assert keys["acme.tcp_listen"].listen_default == "127.0.0.1:1883"
    assert keys["acme.token"].secret and not keys["acme.ws_path"].secret
    assert (keys["acme.ws_path"].help, keys["acme.token"].help) == ("the path of acme's WebSocket route", "")
    # Precedence as for every key: the command line, then the environment, then the file.
    f = tmp_path / "h.toml"
    f.write_text('[acme]\nws_path = "/file"\nkeepalive_s = 5\ntopics = ["a/#"]\nenabled = false\n')
    cfg = load_config(
        {"acme.ws_path": "/cli"},
        env={env_name("acme.ws_path"): "/env", env_name("acme.token"): "s3cret"},
        config_file=str(f),
        dialects=[AcmeConfig],
    )
    section = cfg.section(AcmeConfig)
    assert (section.ws_path, section.keepalive_s, section.topics, section.enabled) == (
        "/cli",
        5.0,
        ("a/#",),
        False,
    )
    assert section.token == "s3cret" and "s3cret" not in repr(cfg)
    assert section.tcp_listen == hubbub.config.LISTEN_OVERRIDE  # tests move every listener (conftest.py)
    assert section.tls_listen == ""  # but not one that is off by default
    assert cfg.dialects == {"acme": section}


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"acme.ws_path": "acme"}, "acme.ws_path: must be a path from /"),
        ({"acme.tcp_listen": "nowhere"}, "acme.tcp_listen: expected HOST:PORT, got 'nowhere'"),
        ({"acme.keepalive_s": "soon"}, "acme.keepalive_s: expected float, got 'soon'"),
        ({"acme.enabled": "maybe"}, "acme.enabled: expected bool, got 'maybe'"),
        ({"acme.auth": "maybe"}, "acme.auth: must be empty (auth.mode), off or token"),
        ({"acme.auth": "token"}, "acme.auth = token needs auth.mode = token"),
        ({"acme.tls_listen": "127.0.0.1:0"}, "acme.tls_listen: needs tls.cert and tls.key"),
        ({"acme.topics": "a"}, "acme.topics: not valid JSON"),
    ],
)
def test_a_dialect_section_checks_its_values_naming_the_key(cli: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(cli, env={}, dialects=[AcmeConfig])
    assert str(err.value) == message


def test_a_dialect_key_is_unknown_without_its_section() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'acme\.ws_path'"):
        load_config({"acme.ws_path": "/x"}, env={})
    with pytest.raises(ConfigError, match=f"unknown environment variable {env_name('acme.ws_path')}"):
        load_config({}, env={env_name("acme.ws_path"): "/x"})


def test_a_section_cannot_take_a_key_another_section_has() -> None:
    @dataclass(frozen=True, slots=True)
    class Clash(DialectSection):
        SECTION: ClassVar[str] = "mist"
        enabled: bool = True
        auth: str = ""

    with pytest.raises(ValueError, match=r"mist\.enabled: a key of MistConfig and Clash"):
        config_keys([*DIALECT_SECTIONS, Clash])


def test_a_dialect_section_has_enabled_and_auth() -> None:
    @dataclass(frozen=True, slots=True)
    class NoAuth(DialectSection):
        SECTION: ClassVar[str] = "noauth"
        enabled: bool = True

    with pytest.raises(TypeError, match="NoAuth: a dialect's section has the fields enabled and auth"):
        config_keys([NoAuth])


def test_a_spec_names_the_section_of_its_config() -> None:
    with pytest.raises(ValueError, match="section 'acme2' but config for 'acme'"):
        DialectSpec(name="acme", section="acme2", config=AcmeConfig)
    for name, spec in SPECS.items():
        assert spec.section == spec.config.SECTION, name
        assert f"{spec.section}.enabled" in KEYS, name
        # Native's section is a core one: its auth is auth.mode's, it has no native.auth.
        assert (f"{spec.section}.auth" in KEYS) is (name != "native"), name


def test_a_binding_is_enabled_by_its_section() -> None:
    off = {f"{b.spec.section}.enabled": "false" for b in BINDINGS[::2]}
    cfg = load_config(off, env={}, dialects=DIALECT_SECTIONS)
    assert [b.enabled(cfg) for b in BINDINGS] == [i % 2 == 1 for i in range(len(BINDINGS))]
    # A Config made in code (without the loader) serves every dialect with its section's defaults.
    assert all(b.enabled(Config()) for b in BINDINGS)


def test_the_command_line_has_every_key_of_every_dialect() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {opt for action in commands.choices["serve"]._actions for opt in action.option_strings}
    for key in KEYS:
        assert flag_name(key) in flags, key
    for section in DIALECT_SECTIONS:
        assert set(section.FLAG_ALIASES) <= flags, section.SECTION
        for name, text in section.HELP.items():  # a dialect's help lines are its section's
            assert HELP[f"{section.SECTION}.{name}"] == text
