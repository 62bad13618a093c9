"""docker/docker-compose.yml is shaped like production, checked without a Docker engine (the
stack itself runs in tests/e2e/test_compose_stack.py).

* Secrets: the dev CA's key is in a volume only ``certs-init`` mounts; Redis requires a password
  and the nodes' Redis URL carries it; Grafana's admin password is a variable, never admin.
* Network: only HAProxy, Prometheus and Grafana publish ports, all on 127.0.0.1; the ``edge``
  network joins HAProxy and the front-ends alone, and HAProxy's fixed address on it is the nodes'
  whole PROXY allow-list.
* Every long-running service has a health check and a restart policy; every image is built from
  the one ``BASE_IMAGE``; docker/env.example names every variable the file uses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
COMPOSE_TEXT = (DOCKER / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, Any] = COMPOSE["services"]
FRONTENDS = ("frontend1", "frontend2", "frontend3")
ONE_SHOT = ("certs-init", "topics-init")


def mounts(service: str) -> dict[str, str]:
    return {v.split(":")[0]: v.split(":")[1] for v in SERVICES[service].get("volumes", [])}


def test_the_ca_key_is_mounted_into_certs_init_alone() -> None:
    holders = [name for name in SERVICES if "ca" in mounts(name)]
    assert holders == ["certs-init"]
    script = " ".join(SERVICES["certs-init"]["entrypoint"])
    assert "--dir /ca" in script and "ca.key" not in script
    for name in FRONTENDS:
        assert mounts(name)["certs"] == "/certs"


def test_redis_requires_the_password_the_nodes_send() -> None:
    redis = SERVICES["redis"]
    assert "--requirepass" in " ".join(redis["command"])
    assert redis["environment"]["REDISCLI_AUTH"].startswith("${REDIS_PASSWORD:?")
    for name in FRONTENDS:
        url = SERVICES[name]["environment"]["HEADWATER_REDIS_URL"]
        assert url.startswith("redis://:${REDIS_PASSWORD:?"), url


def test_grafana_admin_password_comes_from_the_env_file() -> None:
    grafana = SERVICES["grafana"]
    password = grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert password.startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert grafana["profiles"] == ["grafana"]


def test_only_haproxy_and_the_dashboards_publish_on_loopback() -> None:
    published = {name for name, service in SERVICES.items() if service.get("ports")}
    assert published == {"haproxy", "prometheus", "grafana"}
    for name in published:
        for port in SERVICES[name]["ports"]:
            assert port.startswith("127.0.0.1:"), (name, port)


def test_only_haproxy_reaches_the_nodes_and_may_send_proxy_headers() -> None:
    on_edge = {name for name, s in SERVICES.items() if "edge" in (s.get("networks") or [])}
    assert on_edge == {"haproxy", *FRONTENDS}
    assert COMPOSE["networks"]["edge"]["internal"] is True
    haproxy_address = SERVICES["haproxy"]["networks"]["edge"]["ipv4_address"]
    for name in FRONTENDS:
        environment = SERVICES[name]["environment"]
        assert environment["HEADWATER_PROXY_PROTOCOL"] == "yes"
        assert environment["HEADWATER_PROXY_ALLOW"] == haproxy_address


def test_every_service_has_a_health_check_and_a_restart_policy() -> None:
    for name, service in SERVICES.items():
        if name in ONE_SHOT:
            assert service["restart"] == "no"
            continue
        assert "healthcheck" in service, name
        assert service["restart"] == "unless-stopped", name


def test_every_image_is_built_from_the_one_base() -> None:
    for name, service in SERVICES.items():
        if name == "grafana":
            continue  # not packaged by Debian: the official image, behind its profile
        build = service["build"]
        assert build["dockerfile"] == "docker/Dockerfile", name
        assert build["args"]["BASE_IMAGE"] == "${HEADWATER_BASE_IMAGE:-debian:bookworm-slim}"
        assert f"AS {build['target']}\n" in (DOCKER / "Dockerfile").read_text(), name


def test_env_example_names_every_variable_the_file_uses() -> None:
    used = set(re.findall(r"\$\{([A-Z_]+)", COMPOSE_TEXT))
    example = (DOCKER / "env.example").read_text()
    named = set(re.findall(r"^#? ?([A-Z_]+)=", example, flags=re.MULTILINE))
    assert used <= named, used - named
