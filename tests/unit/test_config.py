"""The settings' sources (``frontend.config``, ``frontend.config_file``): flag > variable > file >
default, what a file may hold, and the example file kept equal to the parser."""

from __future__ import annotations

import contextlib
import os
import tomllib
from pathlib import Path

import pytest

from frontend.config import (
    LIMITS,
    NODE,
    SETTINGS,
    NodeConfig,
    Setting,
    build_parser,
    config_from_args,
    declared,
    log_settings,
)
from frontend.config_file import README, keys, parse_args, render_example, render_table, with_table
from frontend.values import INTEGER, TEXT, ConfigError
from headwater.devcluster.up import UpOptions, anonymous_line
from headwater.errors import SettingError
from mqttcore.channel import Limits

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "headwater.example.toml"
REQUIRED = 'node-id = "n1"\nkafka-bootstrap = "k:9092"\n'


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("HEADWATER_")]:
        monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "headwater.toml"
    path.write_text(text)
    return str(path)


def node_config(argv: list[str]) -> NodeConfig:
    return config_from_args(parse_args(argv))


def error(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        node_config(argv)
    return str(caught.value)


# -- precedence ------------------------------------------------------------------------------------

FILE = REQUIRED + 'max-inflight = 7\nproxy-protocol = true\nlisten = "10.0.0.1:1884"\n'


def test_defaults_without_a_file() -> None:
    config = node_config(["--node-id", "n1", "--kafka-bootstrap", "k:9092"])
    assert (config.limits.max_inflight, config.proxy_protocol) == (32, False)
    assert (config.host, config.port) == ("127.0.0.1", 1883)


def test_the_file_over_the_defaults(tmp_path: Path) -> None:
    config = node_config(["--config", write(tmp_path, FILE)])
    assert (config.node_id, config.kafka_bootstrap) == ("n1", "k:9092")
    assert (config.limits.max_inflight, config.proxy_protocol) == (7, True)
    assert (config.host, config.port) == ("10.0.0.1", 1884)


def test_variables_over_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWATER_MAX_INFLIGHT", "9")
    monkeypatch.setenv("HEADWATER_PROXY_PROTOCOL", "no")
    monkeypatch.setenv("HEADWATER_LISTEN", "10.0.0.2:1885")
    config = node_config(["--config", write(tmp_path, FILE)])
    assert (config.limits.max_inflight, config.proxy_protocol) == (9, False)
    assert (config.host, config.port) == ("10.0.0.2", 1885)


def test_flags_over_the_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWATER_MAX_INFLIGHT", "9")
    monkeypatch.setenv("HEADWATER_LISTEN", "10.0.0.2:1885")
    argv = ["--config", write(tmp_path, FILE.replace("true", "false"))]
    argv += ["--max-inflight", "11", "--proxy-protocol", "--listen", "10.0.0.3:1886"]
    config = node_config(argv)
    assert (config.limits.max_inflight, config.proxy_protocol) == (11, True)
    assert (config.host, config.port) == ("10.0.0.3", 1886)


def test_the_variable_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWATER_CONFIG", write(tmp_path, FILE))
    assert node_config([]).limits.max_inflight == 7
    other = tmp_path / "other.toml"
    other.write_text(REQUIRED + "max-inflight = 5\n")
    assert node_config(["--config", str(other)]).limits.max_inflight == 5


def test_every_flag_has_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file yields to a variable by this name; the parser must read the same one."""
    for key, setting in keys().items():
        name = "HEADWATER_" + key.replace("-", "_").upper()
        monkeypatch.setenv(name, "from-the-variable")
        assert build_parser().get_default(setting.dest) == "from-the-variable", name


def test_numeric_flags_take_toml_numbers() -> None:
    """A setting with a numeric default is of kind INTEGER or SECONDS (its TOML type)."""
    untyped = []
    for key, setting in keys().items():
        with contextlib.suppress(TypeError, ValueError):
            float(setting.text or "")
            if setting.kind == TEXT:
                untyped.append(key)
    assert untyped == []


# -- what a file may hold --------------------------------------------------------------------------


def test_an_unknown_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, REQUIRED + "max-infligt = 7\n")
    message = error(["--config", path])
    assert "'max-infligt'" in message and path in message
    assert "max-inflight" in message  # the likely meant key


def test_a_table_is_an_unknown_key(tmp_path: Path) -> None:
    path = write(tmp_path, REQUIRED + "[tls]\ncertfile = 'a.pem'\n")
    assert "'tls'" in error(["--config", path])


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('max-inflight = "7"', "an integer"),
        ("max-inflight = true", "an integer"),
        ("max-inflight = 7.5", "an integer"),
        ('proxy-protocol = "yes"', "true or false"),
        ("proxy-protocol = 1", "true or false"),
        ("listen = 1883", "a string"),
        ('session-expiry = "1h"', "a number of seconds"),
        ('redis-prefix = ["a"]', "a string"),
    ],
)
def test_a_wrong_type_is_refused(tmp_path: Path, line: str, expected: str) -> None:
    path = write(tmp_path, REQUIRED + line + "\n")
    message = error(["--config", path])
    key = line.split(" =")[0]
    assert f"{key} in {path}" in message and expected in message


def test_numbers_of_either_toml_type_are_seconds(tmp_path: Path) -> None:
    config = node_config(["--config", write(tmp_path, REQUIRED + "session-expiry = 90.5\n")])
    assert config.session_expiry == 90.5


def test_a_bad_value_names_flag_variable_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, REQUIRED + "max-inflight = 0\n")
    message = error(["--config", path])
    assert message.startswith(f"--max-inflight / HEADWATER_MAX_INFLIGHT / max-inflight in {path}: ")
    assert "0 is outside 1..65535" in message


def test_a_bad_port_in_the_file_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, REQUIRED + 'listen = "127.0.0.1:99999"\n')
    assert f"--listen / HEADWATER_LISTEN / listen in {path}: 99999" in error(["--config", path])


def test_a_value_from_elsewhere_names_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEADWATER_MAX_INFLIGHT", "0")
    message = error(["--node-id", "n1", "--kafka-bootstrap", "k:9092"])
    assert message == "--max-inflight / HEADWATER_MAX_INFLIGHT: 0 is outside 1..65535"


def test_a_missing_or_broken_file_is_refused(tmp_path: Path) -> None:
    assert "cannot read" in error(["--config", str(tmp_path / "absent.toml")])
    assert "is not TOML" in error(["--config", write(tmp_path, "max-inflight = \n")])


def test_log_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert log_settings(parse_args([])) == ("INFO", "text")
    path = write(tmp_path, 'log-format = "json"\nlog-level = "warning"\n')
    assert log_settings(parse_args(["--config", path])) == ("WARNING", "json")
    monkeypatch.setenv("HEADWATER_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="--log-format / HEADWATER_LOG_FORMAT: 'xml'"):
        log_settings(parse_args([]))


# -- the example file ------------------------------------------------------------------------------


def example_keys() -> set[str]:
    """The keys of the example, commented out or not."""
    lines = EXAMPLE.read_text().splitlines()
    settings = (line.removeprefix("# ") for line in lines if " = " in line)
    return {line.split(" = ")[0] for line in settings if not line.startswith("#")}


def test_the_example_has_every_key_and_no_other() -> None:
    parser_keys = set(keys())
    assert parser_keys - example_keys() == set(), "flags without a key in the example"
    assert example_keys() - parser_keys == set(), "keys of the example without a flag"


def test_the_example_holds_the_defaults() -> None:
    assert tomllib.loads(EXAMPLE.read_text())  # it parses, and sets some keys
    assert vars(parse_args(["--config", str(EXAMPLE)])) == {
        **vars(parse_args([])),
        "config": str(EXAMPLE),
    }


def test_the_example_is_generated_from_the_parser() -> None:
    assert EXAMPLE.read_text() == render_example(), (
        "regenerate it: python -m frontend.config_file --write"
    )


def test_the_readme_table_is_generated_from_the_declarations() -> None:
    readme = README.read_text()
    assert readme == with_table(readme), "regenerate it: python -m frontend.config_file --write"
    for setting in SETTINGS.values():
        assert f"| `{setting.flag}` | `{setting.variable}` |" in render_table()


# -- one declaration per setting -------------------------------------------------------------------


def test_help_names_every_variable_and_switches_say_yes() -> None:
    help_text = " ".join(build_parser().format_help().split())
    for s in SETTINGS.values():
        assert f"[{s.variable}{'=yes' if s.flag_only else ''}]" in help_text, s.name


def test_a_node_built_in_code_gets_the_declared_defaults() -> None:
    """What ``NodeConfig(...)`` leaves out is what the command line would give (but ``$SYS``
    reports, the inbound relay and client events, off in code), and its limits are those of
    ``--max-inflight`` and the like."""
    config = NodeConfig("n", "h", 0, "k", None, "t", 1)
    given = {"node_id", "kafka_bootstrap", "redis_url", "topic", "partitions", "sys_interval"}
    given |= {"inbound_topic", "client_events"}
    for s in SETTINGS.values():
        if s.into == NODE and s.dest not in given:
            assert getattr(config, s.dest) == declared(s.name), s.name
        if s.into == LIMITS:
            assert getattr(Limits(), s.dest) == declared(s.name), s.name
    assert config.sys_interval == 0 and declared("sys-interval") == 10


def test_a_default_must_be_of_its_kind() -> None:
    with pytest.raises(TypeError, match="max-x"):
        Setting("max-x", INTEGER, "32", "what it bounds")


def test_the_log_topic_and_the_key_prefix_are_named_once() -> None:
    """``headwater.messages`` lives in router/topics.py, ``hw:`` in frontend/sessions/redis.py;
    the settings, the tooling and the analytics take them from there.  (bench/ is outside: its load
    generator imports nothing of the product, and names the defaults it drives as a user would.)"""
    root = EXAMPLE.parents[1]
    homes = {'"headwater.messages"': "router/topics.py", '"hw:"': "frontend/sessions/redis.py"}
    for literal, home in homes.items():
        packages = ("frontend", "router", "headwater", "spark_streaming")
        found = [
            str(path.relative_to(root))
            for package in packages
            for path in sorted((root / package).rglob("*.py"))
            if literal in path.read_text()
        ]
        assert found == [home], literal


# -- anonymous clients -----------------------------------------------------------------------------

NODE_ARGV = ["--node-id", "n1", "--kafka-bootstrap", "k:9092"]


def test_an_acl_without_a_way_to_authenticate_stops_start_up_naming_the_settings(
    tmp_path: Path,
) -> None:
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite alice/#\n")
    message = error([*NODE_ARGV, "--acl-file", str(acl)])
    assert message.startswith("--acl-file / HEADWATER_ACL_FILE: ")
    for setting in ("--password-file", "--use-identity-as-username", "--allow-anonymous yes"):
        assert setting in message
    assert "--allow-anonymous" in error(
        [*NODE_ARGV, "--acl-file", str(acl), "--allow-anonymous", "no"]
    )
    config = node_config([*NODE_ARGV, "--acl-file", str(acl), "--allow-anonymous"])
    assert config.allow_anonymous is True


@pytest.mark.parametrize(
    ("argv", "variable", "expected"),
    [
        ([], None, None),  # unset: frontend.auth decides (yes without a way to authenticate)
        (["--allow-anonymous"], None, True),
        (["--allow-anonymous", "no"], None, False),
        ([], "yes", True),
        (["--allow-anonymous", "yes"], "no", True),  # the flag over the variable
    ],
)
def test_allow_anonymous_is_a_switch_left_unset_by_default(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], variable: str | None, expected: bool | None
) -> None:
    if variable is not None:
        monkeypatch.setenv("HEADWATER_ALLOW_ANONYMOUS", variable)
    assert node_config([*NODE_ARGV, *argv]).allow_anonymous is expected


def test_allow_anonymous_in_the_file_is_a_boolean(tmp_path: Path) -> None:
    config = node_config(["--config", write(tmp_path, REQUIRED + "allow-anonymous = false\n")])
    assert config.allow_anonymous is False
    message = error([*NODE_ARGV, "--allow-anonymous", "maybe"])
    assert message == "--allow-anonymous / HEADWATER_ALLOW_ANONYMOUS: 'maybe' is not yes or no"


def test_dev_up_says_what_it_allows_and_refuses_an_acl_no_login_can_select(
    tmp_path: Path,
) -> None:
    options = UpOptions(nodes=1, port=0, state_dir=tmp_path, partitions=1)
    assert anonymous_line(options, {}) == "anonymous clients allowed: no password file"
    passwords = UpOptions(1, 0, tmp_path, 1, password_file=tmp_path / "passwd")
    assert anonymous_line(passwords, {}).startswith("anonymous clients refused: only password")
    acl_only = UpOptions(1, 0, tmp_path, 1, acl_file=tmp_path / "acl")
    with pytest.raises(SettingError, match="--allow-anonymous yes"):
        anonymous_line(acl_only, {})
    allowed = anonymous_line(acl_only, {"HEADWATER_ALLOW_ANONYMOUS": "yes"})
    assert allowed == "anonymous clients allowed: no password file"
