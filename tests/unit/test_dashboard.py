"""The Grafana dashboard (``docker/grafana/dashboards/headwater.json``) against the code: every
metric a panel's query names is one ``frontend.metrics``' collector exposes, so the dashboard
cannot drift from ``/metrics``; and its panels use the provisioned data source."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from frontend.metrics import SnapshotCollector
from router.log import LatencyHistogram

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "headwater.json"
DATASOURCES = DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

METRIC = re.compile(r"\bheadwater_[a-z0-9_]+")

WANTED = (
    "headwater_connections",
    "headwater_connections_opened_total",
    "headwater_connections_refused_total",
    "headwater_messages_received_total",
    "headwater_messages_sent_total",
    "headwater_produce_latency_seconds_bucket",
    "headwater_consumer_lag",
    "headwater_drops_total",
    "headwater_denials_total",
    "headwater_sessions_live",
    "headwater_wills_published_total",
    "headwater_session_takeovers_total",
    "headwater_kafka_available",
    "headwater_redis_reachable",
)
"""What the operations issue asks the dashboard to show."""


def snapshot() -> dict[str, Any]:
    """A ``/stats`` snapshot with every key the collector reads (zero where not set)."""
    stats: dict[str, Any] = defaultdict(int)
    stats.update(
        consumer_lag={"0": 3},
        assigned_partitions=[0],
        paused_partitions=[],
        messages_received_by_qos={"0": 0, "1": 0, "2": 0},
        messages_sent_by_qos={"0": 0, "1": 0, "2": 0},
        produce_latency=LatencyHistogram().snapshot(),
    )
    return stats


def exposed() -> set[str]:
    """Every sample name ``/metrics`` has (``_total``, ``_bucket``, ``_sum``, ``_count``)."""
    return {
        sample.name for family in SnapshotCollector(snapshot).collect() for sample in family.samples
    }


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, and of the template variables."""
    dashboard = json.loads(DASHBOARD.read_text())
    found = [
        (panel["title"], target["expr"])
        for panel in panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        found.append((f"${variable['name']}", variable["definition"]))
    return found


def test_every_metric_a_panel_uses_is_exposed() -> None:
    names = exposed()
    unknown = [
        f"{title}: {name}"
        for title, expr in queries()
        for name in METRIC.findall(expr)
        if name not in names
    ]
    assert not unknown, "the dashboard uses metrics /metrics does not have:\n" + "\n".join(unknown)


def test_the_dashboard_shows_what_operations_asked_for() -> None:
    used = {name for _, expr in queries() for name in METRIC.findall(expr)}
    assert not set(WANTED) - used


def test_panels_use_the_provisioned_data_source() -> None:
    provisioned = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    uids = {source["uid"] for source in provisioned if source["type"] == "prometheus"}
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in panels(dashboard["panels"]):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] in uids, panel["title"]
            assert panel["targets"], panel["title"]
    ids = [panel["id"] for panel in panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
