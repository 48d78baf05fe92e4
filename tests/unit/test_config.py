from __future__ import annotations

from pathlib import Path

import pytest

import hubbub.config
from hubbub.config import ConfigError, env_name, flag_name
from hubbub.dialects.mist import MistConfig
from hubbub.dialects.wearscript import WearscriptConfig
from hubbub.server_config import load_config
from tests.conftest import DEFAULT_MIST_TCP_LISTEN, REAL_LISTEN_DEFAULTS


def test_defaults() -> None:
    cfg = load_config({}, env={})
    assert REAL_LISTEN_DEFAULTS["http.listen"] == "127.0.0.1:8080"  # the shipped default
    assert REAL_LISTEN_DEFAULTS["native.tcp_listen"] == "127.0.0.1:7400"
    assert cfg.http.listen == hubbub.config.LISTEN_OVERRIDE  # a free port in tests (tests/conftest.py)
    assert cfg.storage.data_dir == "./hubbub-data"
    assert cfg.storage.durability == "commit"
    assert cfg.limits.max_frame == 1 << 20


def test_precedence_cli_env_file(tmp_path: Path) -> None:
    f = tmp_path / "h.toml"
    f.write_text('durability = "none"\n[limits]\nmax_frame = 100\nmax_tags = 5\n')
    env = {"HUBBUB_LIMITS_MAX_FRAME": "200", "HUBBUB_DURABILITY": "fsync"}
    cfg = load_config({"durability": "commit"}, env=env, config_file=str(f))
    assert cfg.storage.durability == "commit"  # CLI beats env
    assert cfg.limits.max_frame == 200  # env beats file
    assert cfg.limits.max_tags == 5  # file beats default


def test_names() -> None:
    assert flag_name("http.listen") == "--http-listen"
    assert flag_name("limits.max_frame") == "--limits-max-frame"
    assert env_name("mist.tcp_listen") == "HUBBUB_MIST_TCP_LISTEN"
    assert env_name("log.retention.max_age_s") == "HUBBUB_LOG_RETENTION_MAX_AGE_S"


@pytest.mark.parametrize(
    ("cli", "needle"),
    [
        ({"durability": "sometimes"}, "durability"),
        ({"limits.max_frame": "lots"}, "limits.max_frame"),
        ({"limits.max_frame": "0"}, "limits.max_frame"),
        ({"http.listen": "nowhere"}, r"^http\.listen: expected HOST:PORT"),
        ({"native.tcp_listen": "nowhere"}, r"^native\.tcp_listen: expected HOST:PORT"),
        ({"native.enabled": "maybe"}, "native.enabled"),
        ({"native.idempotency_window_s": "-1"}, "native.idempotency_window_s"),
    ],
)
def test_errors_name_the_key(cli: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(cli, env={})


def test_unknown_file_key(tmp_path: Path) -> None:
    f = tmp_path / "h.toml"
    f.write_text("nonsense = 1\n")
    with pytest.raises(ConfigError, match="nonsense"):
        load_config({}, env={}, config_file=str(f))


def test_idempotency_window_takes_fractions_of_a_second(tmp_path: Path) -> None:
    assert load_config({}, env={}).native.idempotency_window_s == 600
    f = tmp_path / "h.toml"
    f.write_text("[native]\nidempotency_window_s = 30\n")  # a TOML integer for the float key
    assert load_config({}, env={}, config_file=str(f)).native.idempotency_window_s == 30.0
    env = {"HUBBUB_NATIVE_IDEMPOTENCY_WINDOW_S": "0.5"}
    assert load_config({}, env=env, config_file=str(f)).native.idempotency_window_s == 0.5


def test_mist_keys() -> None:
    assert DEFAULT_MIST_TCP_LISTEN == "127.0.0.1:1445"  # the shipped default (tests' servers use free ports)
    mist = load_config({}, env={}).section(MistConfig)
    assert (mist.enabled, mist.tcp_listen, mist.channel, mist.auth) == (
        True,
        hubbub.config.LISTEN_OVERRIDE,
        "/mist",
        "",
    )
    cfg = load_config(
        {"mist.tcp_listen": "127.0.0.1:0", "mist.token": "s3cret"},
        env={"HUBBUB_MIST_TCP_LISTEN": "127.0.0.1:9", "HUBBUB_MIST_ENABLED": "false"},
    )
    mist = cfg.section(MistConfig)
    assert mist.tcp_listen == "127.0.0.1:0"  # the flag beats the environment
    assert not mist.enabled
    assert mist.token == "s3cret" and "s3cret" not in repr(cfg)
    assert flag_name("mist.tcp_listen") == "--mist-tcp-listen"
    for bad, needle in (
        ({"mist.tcp_listen": "nowhere"}, "mist.tcp_listen"),
        ({"mist.channel": "mist"}, "mist.channel"),
        ({"mist.channel": "/a%41"}, "mist.channel"),
        ({"mist.auth": "token"}, "mist.auth"),  # needs auth.mode = token
        ({"mist.auth": "maybe"}, "mist.auth"),
    ):
        with pytest.raises(ConfigError, match=needle):
            load_config(bad, env={})


def test_cluster_keys() -> None:
    pg = "postgresql://hubbub@127.0.0.1:5432/hubbub"
    env = {"HUBBUB_STORE": pg, "HUBBUB_BROKER": "redis://127.0.0.1:6379/0", "HUBBUB_CLUSTER_NODE_ID": "n1"}
    cfg = load_config({"cluster.gap_wait_s": "0.25"}, env=env)
    c = cfg.cluster
    assert (c.broker, c.node_id, c.gap_wait_s) == (env["HUBBUB_BROKER"], "n1", 0.25)
    assert c.redis_channel == "hubbub.events" and c.poll_interval_s == 1.0
    with pytest.raises(ConfigError, match="share one log"):
        load_config({"broker": "redis://127.0.0.1:6379"}, env={})
    with pytest.raises(ConfigError, match="broker: expected"):
        load_config({"broker": "http://x", "store": pg}, env={})
    with pytest.raises(ConfigError, match="must be positive"):
        load_config({"broker": "redis://x", "store": pg, "cluster.gap_wait_s": "0"}, env={})


@pytest.mark.parametrize("workers", ["0", "2"])
def test_workers_on_postgresql_are_cluster_members_and_need_the_broker(workers: str) -> None:
    pg = "postgresql://hubbub@127.0.0.1:5432/hubbub"
    with pytest.raises(ConfigError, match=r"set cluster\.broker"):
        load_config({"server.workers": workers, "store": pg}, env={})
    cfg = load_config({"server.workers": workers, "store": pg, "broker": "redis://127.0.0.1:6379"}, env={})
    assert cfg.server.workers == int(workers) and cfg.cluster.broker
    assert load_config({"store": pg}, env={}).server.workers == 1  # one process needs no broker


def test_wearscript_keys(tmp_path: Path) -> None:
    cfg = load_config(cli={}, env={})
    ws = cfg.section(WearscriptConfig)
    assert ws.enabled and ws.test_handler and ws.advertise_foreign
    assert ws.group_device == "server:0" and ws.hub_channels == ()
    assert ws.upstream == "" and cfg.dialect_auth("wearscript") == "off"
    url = "ws://127.0.0.1:9/wearscript/ws/s3cret"
    cfg = load_config(
        cli={"wearscript.hub_channels": '["gist"]'},
        env={"HUBBUB_WEARSCRIPT_UPSTREAM": url, "HUBBUB_WEARSCRIPT_GROUP_DEVICE": "hub:1"},
    )
    ws = cfg.section(WearscriptConfig)
    assert ws.upstream == url and ws.group_device == "hub:1"
    assert list(ws.hub_channels) == ["gist"]
    assert "s3cret" not in repr(cfg)  # the upstream URL may hold a token
    toml = tmp_path / "c.toml"
    toml.write_text('[wearscript]\ntest_handler = false\nauth = "off"\n')
    cfg = load_config(config_file=str(toml), env={})
    assert not cfg.section(WearscriptConfig).test_handler and cfg.dialect_auth("wearscript") == "off"
    assert flag_name("wearscript.upstream") == "--wearscript-upstream"
    for cli, needle in [
        ({"wearscript.group_device": "server"}, "wearscript.group_device"),
        ({"wearscript.group_device": ":0"}, "wearscript.group_device"),
        ({"wearscript.upstream": "http://x/wearscript/ws"}, "wearscript.upstream"),
        ({"wearscript.auth": "token"}, "wearscript.auth"),
        ({"wearscript.hub_channels": "gist"}, "wearscript.hub_channels"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            load_config(cli=cli, env={})


def test_upstream_from_flags_environment_and_file(tmp_path: Path) -> None:
    """``upstream``: repeatable on the command line, URLs separated by spaces or commas (or a JSON list) in
    ``HUBBUB_UPSTREAM``, a TOML array in a file; masked in ``repr`` (a URL may hold a token)."""
    cfg = load_config({"upstream": ["ws://a:1", "ws://b:2?token=s3cret"]}, env={})
    assert cfg.federation.upstream == ("ws://a:1", "ws://b:2?token=s3cret")
    assert "s3cret" not in repr(cfg)
    fed = load_config({}, env={"HUBBUB_UPSTREAM": "ws://a:1, ws://b:2"}).federation
    assert fed.upstream == ("ws://a:1", "ws://b:2")
    assert load_config({}, env={"HUBBUB_UPSTREAM": '["ws://a:1"]'}).federation.upstream == ("ws://a:1",)
    f = tmp_path / "c.toml"
    f.write_text('upstream = ["wss://a:1"]\n[federation]\nnode_id = "site-3"\ntoken = "t"\n')
    cfg = load_config({}, env={}, config_file=str(f))
    fed = cfg.federation
    assert (fed.upstream, fed.node_id, fed.token) == (("wss://a:1",), "site-3", "t")
    assert "'t'" not in repr(cfg)
    with pytest.raises(ConfigError, match="upstream"):
        load_config({"upstream": ["http://a:1"]}, env={})
    with pytest.raises(ConfigError, match=r"federation\.node_id"):
        load_config({"federation.node_id": "a b"}, env={})
    cfg = load_config({}, env={"HUBBUB_FEDERATION_TOKEN_FILE": "/run/secrets/link"})
    assert cfg.federation.token_file == "/run/secrets/link"
    with pytest.raises(ConfigError, match="give one of them"):
        load_config({"federation.token": "t", "federation.token_file": "/run/secrets/link"}, env={})


def test_a_misspelt_environment_variable_is_refused_naming_the_closest() -> None:
    # Written in two parts: tests/unit/test_docs_reference.py fails on a HUBBUB_ name it does not know.
    typo, unknown = "HUBBUB_" + "DURABILTY", "HUBBUB_" + "ZZZ"
    with pytest.raises(ConfigError, match=rf"{typo} \(did you mean HUBBUB_DURABILITY\?\)"):
        load_config({}, env={typo: "fsync"})
    with pytest.raises(ConfigError, match=rf"unknown environment variable {unknown}$"):
        load_config({}, env={unknown: "1"})


def test_a_misspelt_file_key_is_refused_naming_the_closest(tmp_path: Path) -> None:
    f = tmp_path / "h.toml"
    f.write_text('durabilty = "fsync"\n')
    with pytest.raises(ConfigError, match=r"unknown key 'durabilty' \(did you mean 'durability'\?\)"):
        load_config({}, env={}, config_file=str(f))


def test_variables_of_the_clients_and_the_tests_are_not_refused() -> None:
    env = {name: "x" for name in hubbub.config.OTHER_ENV}
    env["GUBLE_SOMETHING"] = "ignored with a warning, as before"
    env["OTHER_PROGRAM_VAR"] = "1"
    assert load_config({}, env=env).storage.durability == "commit"
