"""``docker/docker-compose.yml`` without a Docker engine: valid by the Compose Specification,
and checked against the code ``headwater dev up`` runs, so that the two cannot drift.

* The schema: the Compose Specification's own JSON schema (``compose-spec.json`` from
  github.com/compose-spec/compose-spec), as check-jsonschema ships it (its
  ``vendor.compose-spec``, refreshed with each release), validated with ``jsonschema`` after YAML
  has resolved the anchors and merge keys, as Compose does.
* The front-ends: their command line and ``HEADWATER_*`` variables are parsed by the node's own
  parser (``frontend.config.build_parser``); every setting ``dev up`` gives a node
  (``headwater.devcluster.nodes.NodeSpec``) is given here too.
* HAProxy: ``docker/haproxy.cfg`` is what ``headwater.services.haproxy.render_config`` makes for the
  compose front-ends, plus Docker's DNS lines, and ``haproxy -c`` accepts it.
* Prometheus scrapes every front-end's stats port; the Spark job's flags parse and validate.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from frontend.config import build_parser
from headwater.devcluster.nodes import NodeSecurity, NodeSpec
from headwater.services.haproxy import Server, render_config, routes
from router.topics import MESSAGES_TOPIC

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
HAPROXY_CFG = DOCKER / "haproxy.cfg"
PROMETHEUS = DOCKER / "prometheus.yml"
FRONTENDS = ("frontend1", "frontend2", "frontend3")

DOCKER_RESOLVERS = """resolvers docker
    nameserver dns 127.0.0.11:53
    hold valid 10s

"""
DOCKER_DEFAULT_SERVER = "    default-server resolvers docker init-addr last,libc,none\n"
"""What docker/haproxy.cfg adds to the rendered config: container names resolved by Docker's
DNS, servers starting without an address until their container is up."""


def compose() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def compose_schema() -> dict[str, Any]:
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    assert isinstance(schema, dict)
    return schema


def schema_errors(document: dict[str, Any]) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(
        schema, format_checker=jsonschema.FormatChecker()
    )
    return [
        f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def node_args(service: str, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The front-end ``service`` parsed as the node parses itself: variables, then flags."""
    spec = compose()["services"][service]
    for name in [name for name in os.environ if name.startswith("HEADWATER_")]:
        monkeypatch.delenv(name)
    for name, value in spec["environment"].items():
        monkeypatch.setenv(name, str(value))
    command = spec["command"]
    assert command[0] == "frontend"
    return build_parser().parse_args(command[1:])


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


# -- the schema ---------------------------------------------------------------------------------


def test_compose_file_is_valid_by_the_compose_specification() -> None:
    errors = schema_errors(compose())
    assert not errors, "\n".join(errors)


def test_the_schema_check_catches_mistakes() -> None:
    document = compose()
    document["services"]["redis"]["healthcheck"]["interval"] = {"seconds": 2}
    document["services"]["kafka"]["imagee"] = "apache/kafka"
    document["services"]["haproxy"]["depends_on"] = {"frontend1": {"condition": "up"}}
    assert len(schema_errors(document)) >= 3


def test_the_services_the_cluster_needs_are_there() -> None:
    services = compose()["services"]
    for name in ("kafka", "redis", *FRONTENDS, "haproxy", "spark", "prometheus", "grafana"):
        assert name in services, name
    for name in FRONTENDS:
        assert services[name]["healthcheck"]["test"][-1].endswith("9100/ready', timeout=2)")


def test_bind_mounts_name_files_that_exist() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name}: {source}"


# -- the front-ends and dev up ------------------------------------------------------------------


def test_front_end_variables_are_flags_of_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    flags = {option for action in build_parser()._actions for option in action.option_strings}
    for name in FRONTENDS:
        for variable in compose()["services"][name]["environment"]:
            assert variable.startswith("HEADWATER_"), variable
            flag = "--" + variable.removeprefix("HEADWATER_").lower().replace("_", "-")
            assert flag in flags, f"{name}: {variable} is no flag of the node ({flag})"
        node_args(name, monkeypatch)  # and the whole command line parses


def test_front_ends_get_every_setting_dev_up_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = NodeSpec(
        "node0", 1883, "kafka:9092", "redis://redis:6379/0", 12, 9100, tls_port=8883,
        ws_port=8080, security=NodeSecurity(Path("c"), Path("k"), Path("ca"), proxy_protocol=True),
    )  # fmt: skip
    dev_up = {arg for arg in spec.argv() if arg.startswith("--")}
    services = compose()["services"]
    partitions = services["topics-init"]["command"]
    node_ids = set()
    for name in FRONTENDS:
        spec_ = services[name]
        given = {arg for arg in spec_["command"] if arg.startswith("--")}
        given |= {
            "--" + variable.removeprefix("HEADWATER_").lower().replace("_", "-")
            for variable in spec_["environment"]
        }
        assert not dev_up - given, f"{name} lacks {sorted(dev_up - given)}"
        args = node_args(name, monkeypatch)
        assert args.topic == MESSAGES_TOPIC
        assert args.partitions == partitions[partitions.index("--partitions") + 1]
        assert args.proxy_protocol == "yes"
        node_ids.add(args.node_id)
    assert len(node_ids) == len(FRONTENDS)


# -- HAProxy ------------------------------------------------------------------------------------


def expected_haproxy_cfg(monkeypatch: pytest.MonkeyPatch) -> str:
    """``render_config`` for the compose front-ends and HAProxy's published container ports,
    with Docker's DNS lines."""
    servers = []
    send_proxy = True
    for name in FRONTENDS:
        args = node_args(name, monkeypatch)
        servers.append(
            Server(
                args.node_id, name, port_of(args.listen), port_of(args.stats_listen),
                tls_port=port_of(args.tls_listen), ws_port=port_of(args.ws_listen),
            )
        )  # fmt: skip
        send_proxy = send_proxy and args.proxy_protocol == "yes"
    published = [int(port.rpartition(":")[2]) for port in compose()["services"]["haproxy"]["ports"]]
    plain, tls, ws = published
    rendered = render_config(plain, servers, "", tls_port=tls, ws_port=ws, send_proxy=send_proxy)
    assert [route.port for route in routes(plain, tls, ws)] == published
    rendered = rendered.replace("\ndefaults\n", f"\n{DOCKER_RESOLVERS}defaults\n", 1)
    return rendered.replace(
        "    option redispatch\n", "    option redispatch\n" + DOCKER_DEFAULT_SERVER
    )


def test_haproxy_cfg_is_what_dev_up_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = HAPROXY_CFG.read_text().splitlines(keepends=True)
    config = "".join(line for line in lines if not line.startswith("#"))
    assert config == expected_haproxy_cfg(monkeypatch)


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
def test_haproxy_accepts_the_config() -> None:
    """The container names do not resolve here: ``init-addr ... none`` starts such servers
    disabled (a warning), as in a container whose front-ends are not up yet."""
    haproxy = shutil.which("haproxy")
    assert haproxy is not None
    result = subprocess.run(
        [haproxy, "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- Prometheus, Grafana and Spark ----------------------------------------------------------------


def test_prometheus_scrapes_every_front_end(monkeypatch: pytest.MonkeyPatch) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = {target for group in job["static_configs"] for target in group["targets"]}
    stats = {f"{name}:{port_of(node_args(name, monkeypatch).stats_listen)}" for name in FRONTENDS}
    assert targets == stats
    mounted = compose()["services"]["prometheus"]["volumes"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounted


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"])
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    providers = yaml.safe_load(
        (DOCKER / "grafana/provisioning/dashboards/headwater.yml").read_text()
    )["providers"]
    path = providers[0]["options"]["path"]
    assert mounts["./grafana/dashboards"] == path
    assert (DOCKER / "grafana/dashboards/headwater.json").is_file()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{path}/headwater.json"


def test_the_spark_job_parses_and_validates() -> None:
    pytest.importorskip("pyspark")
    from spark_streaming.cli import build_parser as analytics_parser
    from spark_streaming.cli import options_from_args
    from spark_streaming.jobs import JOBS
    from spark_streaming.options import validate

    spark = compose()["services"]["spark"]
    command = spark["command"]
    assert command[0] == "analytics"
    options = options_from_args(analytics_parser().parse_args(command[1:]))
    validate(options, JOBS[options.job].APPEND_ONLY)
    assert options.topic == MESSAGES_TOPIC
    assert options.checkpoint is not None
    assert any(volume.endswith(":/checkpoints") for volume in spark["volumes"])
    assert spark["build"]["target"] == "analytics"
