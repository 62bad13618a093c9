"""The settings that bound what a stranger and a client can make a node hold, and whom a PROXY
header is believed from (issue 20, items 3 and 8): finite defaults, and a bad value stops
start-up naming its flag."""

from __future__ import annotations

import os
import resource

import pytest

from frontend.buffers import DEFAULT_MAX_BUFFERED_BYTES
from frontend.config import FILE_RESERVE, NodeConfig, build_parser, config_from_args
from frontend.config_file import parse_args
from frontend.values import ConfigError
from mqttcore.codec import DEFAULT_MAX_CONNECT_SIZE, DEFAULT_MAX_WILL_SIZE

REQUIRED = ["--node-id", "n1", "--kafka-bootstrap", "k:9092"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("HEADWATER_")]:
        monkeypatch.delenv(name)


def node_config(*argv: str) -> NodeConfig:
    return config_from_args(parse_args([*REQUIRED, *argv]))


def test_max_connections_defaults_to_what_the_file_limit_leaves() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert node_config().max_connections == soft - FILE_RESERVE - 50
    assert node_config("--redis-connections", "150").max_connections == soft - FILE_RESERVE - 150
    assert node_config("--max-connections", "100").max_connections == 100
    assert NodeConfig("n", "h", 0, "k", None, "t", 1).max_connections == soft - FILE_RESERVE - 50
    help_text = build_parser().format_help()
    assert (
        "RLIMIT_NOFILE" in help_text and f"less {FILE_RESERVE} + --redis-connections" in help_text
    )


def test_the_bounds_have_finite_defaults() -> None:
    config = node_config()
    assert (config.max_connect_size, config.max_will_size) == (16 * 1024, 16 * 1024)
    assert (DEFAULT_MAX_CONNECT_SIZE, DEFAULT_MAX_WILL_SIZE) == (16 * 1024, 16 * 1024)
    assert config.max_buffered_bytes == DEFAULT_MAX_BUFFERED_BYTES == 256 * 1024 * 1024
    assert config.proxy_allow.allows("127.0.0.1") and config.proxy_allow.allows("::1")
    assert not config.proxy_allow.allows("10.0.0.1")
    assert config.ws_origins == frozenset()


def test_the_settings_are_read_from_flags_and_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWATER_PROXY_ALLOW", "10.0.0.0/8,fd00::/8")
    monkeypatch.setenv("HEADWATER_WS_ORIGINS", "https://App.example.com/,http://localhost:3000")
    config = node_config("--max-connect-size", "4096", "--max-will-size", "0")
    assert (config.max_connect_size, config.max_will_size) == (4096, 0)
    assert config.proxy_allow.allows("10.2.3.4") and not config.proxy_allow.allows("127.0.0.1")
    assert config.ws_origins == {"https://app.example.com", "http://localhost:3000"}


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--max-connections", "0"], "--max-connections / HEADWATER_MAX_CONNECTIONS"),
        (["--max-connect-size", "10"], "--max-connect-size / HEADWATER_MAX_CONNECT_SIZE"),
        (["--max-will-size", "70000"], "--max-will-size / HEADWATER_MAX_WILL_SIZE"),
        (["--max-buffered-bytes", "0"], "--max-buffered-bytes / HEADWATER_MAX_BUFFERED_BYTES"),
        (["--proxy-allow", "10.0.0.0/33"], "--proxy-allow / HEADWATER_PROXY_ALLOW"),
        (["--proxy-allow", "lb.example.com"], "--proxy-allow / HEADWATER_PROXY_ALLOW"),
        (["--ws-origins", "app.example.com"], "--ws-origins / HEADWATER_WS_ORIGINS"),
    ],
)
def test_a_bad_value_stops_start_up_naming_its_flag(argv: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        node_config(*argv)
