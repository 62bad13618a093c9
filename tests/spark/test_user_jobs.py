"""Users' own jobs on the real log: ``headwater analytics sql QUERY`` and ``run FILE`` over the
``messages`` and ``events`` views, the shipped SQL files, the Kafka sink and bad queries.

Records are written to a fresh log topic with a plain confluent-kafka producer, encoded by
``router.record`` with the headers a node gives them (client events as docs/log.md specifies them,
the way nodes will write them), some without headers as older writers left them.  Streaming runs
use the available-now trigger and the memory sink in this process; the issue's "Done when"
commands run as a user types them, as ``headwater`` processes, against a front-end node's log on
the default topic, the Kafka found from a dev cluster state file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from pyspark.sql import Row, SparkSession

from frontend.node import Node, NodeConfig
from headwater.cli import main as headwater_main
from headwater.devcluster.state import ClusterState, ProcessRecord, write_state
from headwater.services.kafka_admin import TopicMismatchError, ensure_topic
from mqttcore.message import Message
from router import record
from router.partitioner import Router
from router.topics import MESSAGES_TOPIC, messages_topic
from spark_streaming.cli import sql_text
from spark_streaming.options import ANALYTICS_ORIGIN, JobOptions, OptionsError, Trigger
from spark_streaming.payload_schema import payload_schema
from spark_streaming.runner import run
from tests.spark.conftest import log_messages

pytestmark = pytest.mark.spark

PARTITIONS = 4
T0 = (time.time_ns() // 60_000_000_000 - 10) * 60_000  # a whole minute, within retention
HEADWATER = str(Path(sys.executable).parent / "headwater")


def message(
    topic: str, payload: bytes, client_id: str, ts: int, origin: str = "node1", retain: bool = False
) -> Message:
    return Message(topic, payload, 0, retain, client_id, origin, ts, uuid.uuid4().bytes)


def event(name: str, client_id: str, ts: int, **fields: Any) -> Message:
    """A client event as docs/log.md ("Client events") specifies it."""
    body = {"event": name, "client_id": client_id, "username": None, "node": "node1"}
    body |= {"timestamp": ts, **fields}
    return message(f"$events/{name}", json.dumps(body).encode(), client_id, ts)


def produce(
    bootstrap: str, topic: str, records: list[tuple[Message, str | None]], partitions: int
) -> None:
    """Write each message as a node would, with the headers of its kind (None: no headers)."""
    router = Router(partitions, 2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for m, kind in records:
        partition, key = router.route(m.topic)
        extra: dict[str, Any] = {"timestamp": m.timestamp_ms}
        if kind is not None:
            extra["headers"] = record.headers(m, kind)
        producer.produce(topic, record.encode(m), key, partition, **extra)
    assert producer.flush(30) == 0


def run_query(
    spark: SparkSession, bootstrap: str, topic: str, job: str, target: str, **flags: Any
) -> list[Row]:
    """Rows of one available-now run of ``sql``/``run`` into the memory sink."""
    name = f"q_{uuid.uuid4().hex[:8]}"
    options = JobOptions(
        job=job,
        bootstrap=bootstrap,
        topic=topic,
        sink="memory",
        trigger=Trigger(available_now=True),
        query_name=name,
        shuffle_partitions=2,
        query=sql_text(target) if job == "sql" else None,
        job_file=target if job == "run" else None,
        **flags,
    )
    run(options, spark, quiet=True)
    return spark.table(name).collect()


@pytest.fixture
def log(kafka_bootstrap: str) -> str:
    """A fresh log topic holding client messages, node records and events of dev1 and dev2."""
    name = f"test.{uuid.uuid4().hex[:12]}"
    ensure_topic(kafka_bootstrap, name, PARTITIONS, messages_topic(PARTITIONS).config)
    c = [21.0, 22.0, 26.0, 30.0]
    records: list[tuple[Message, str | None]] = [
        (message("plant/dev1/temp", b'{"c": %g}' % c[0], "dev1", T0 + 1_000), record.CLIENT),
        (message("plant/dev1/temp", b'{"c": %g}' % c[1], "dev1", T0 + 2_000), record.CLIENT),
        (message("plant/dev1/temp", b'{"c": %g}' % c[2], "dev1", T0 + 61_000), None),
        (message("plant/dev2/temp", b'{"c": %g}' % c[3], "dev2", T0 + 3_000), record.CLIENT),
        (message("plant/dev2/temp", b"not json", "dev2", T0 + 4_000), record.CLIENT),
        (message("$SYS/brokers/node1/uptime", b"12", "", T0 + 5_000, retain=True), record.SYS),
        (message("$SYS/brokers/node1/uptime", b"13", "", T0 + 6_000, retain=True), None),
        (message("analytics/sql", b"{}", "x", T0 + 7_000, ANALYTICS_ORIGIN), record.ANALYTICS),
        (event("connected", "dev1", T0 + 500, clean_session=True), record.EVENT),
        (
            event("subscribed", "dev1", T0 + 600, filters=[{"filter": "cmd/dev1/#", "qos": 1}]),
            record.EVENT,
        ),
        (event("unsubscribed", "dev1", T0 + 700, filters=["cmd/dev1/#"]), record.EVENT),
        (event("disconnected", "dev1", T0 + 62_000, reason="keep_alive_timeout"), record.EVENT),
        (event("connected", "dev2", T0 + 800, clean_session=False, username="bob"), None),
        (event("disconnected", "dev2", T0 + 9_000, reason="taken_over"), record.EVENT),
        (event("connected", "dev2", T0 + 9_100, clean_session=False), record.EVENT),
    ]
    produce(kafka_bootstrap, name, records, PARTITIONS)
    return name


def test_messages_are_the_clients_messages_with_a_parsed_data_column(
    spark: SparkSession, kafka_bootstrap: str, log: str, tmp_path: Path
) -> None:
    query = "SELECT topic, client_id, kind, data.c AS c FROM messages"
    rows = run_query(spark, kafka_bootstrap, log, "sql", query, payload_schema="c DOUBLE")
    assert sorted((r.topic, r.client_id, r.kind, r.c or -1.0) for r in rows) == [
        ("plant/dev1/temp", "dev1", "client", 21.0),
        ("plant/dev1/temp", "dev1", "client", 22.0),
        ("plant/dev1/temp", "dev1", "client", 26.0),  # no headers: a client's by its value
        ("plant/dev2/temp", "dev2", "client", -1.0),  # not JSON: data is null
        ("plant/dev2/temp", "dev2", "client", 30.0),
    ]
    schema_file = tmp_path / "reading.json"
    schema_file.write_text(json.dumps({"type": "object", "properties": {"c": {"type": "number"}}}))
    everything = run_query(
        spark,
        kafka_bootstrap,
        log,
        "sql",
        "SELECT kind, count(*) AS n, sum(data.c) AS c FROM messages GROUP BY kind",
        payload_schema=str(schema_file),
        include_node_records=True,
        output_mode="complete",
    )
    assert {r.kind: (r.n, r.c) for r in everything} == {
        "client": (5, 99.0),
        "sys": (2, None),  # one of them known by its $SYS topic alone
        "analytics": (1, None),
        "event": (7, None),
    }


def test_events_are_the_client_events_as_columns(
    spark: SparkSession, kafka_bootstrap: str, log: str
) -> None:
    rows = run_query(spark, kafka_bootstrap, log, "sql", "SELECT * FROM events")
    assert rows and list(rows[0].asDict()) == [
        "event",
        "client_id",
        "username",
        "node",
        "reason",
        "clean_session",
        "filters",
        "timestamp",
    ]
    got = sorted(rows, key=lambda r: (r.client_id, r.timestamp))
    assert [(r.client_id, r.event, r.reason, r.clean_session, r.username) for r in got] == [
        ("dev1", "connected", None, True, None),
        ("dev1", "subscribed", None, None, None),
        ("dev1", "unsubscribed", None, None, None),
        ("dev1", "disconnected", "keep_alive_timeout", None, None),
        ("dev2", "connected", None, False, "bob"),  # no headers: an event by its topic
        ("dev2", "disconnected", "taken_over", None, None),
        ("dev2", "connected", None, False, None),
    ]
    assert json.loads(got[1].filters) == [{"filter": "cmd/dev1/#", "qos": 1}]
    assert json.loads(got[2].filters) == ["cmd/dev1/#"]
    assert got[0].timestamp == datetime.fromtimestamp((T0 + 500) / 1000)  # naive, local
    assert {r.node for r in got} == {"node1"}


def test_the_shipped_sql_files(spark: SparkSession, kafka_bootstrap: str, log: str) -> None:
    online = run_query(
        spark, kafka_bootstrap, log, "sql", "devices_online.sql", output_mode="complete"
    )
    assert sorted(
        (r.window_start, r.connected, r.disconnected, r.net_change, r.keep_alive_timeouts)
        for r in online
    ) == [
        (datetime.fromtimestamp(T0 / 1000), 2, 1, 2, 0),
        (datetime.fromtimestamp((T0 + 60_000) / 1000), 0, 1, -1, 1),
    ]
    stats = run_query(
        spark, kafka_bootstrap, log, "sql", "device_stats.sql", output_mode="complete"
    )
    got = {(r.client_id, r.window_start.timestamp() * 1000): r for r in stats}
    assert sorted(got) == [("dev1", T0), ("dev1", T0 + 60_000), ("dev2", T0)]
    first = got[("dev1", T0)]
    assert (first.messages, first.min_c, first.avg_c, first.max_c) == (2, 21.0, 21.5, 22.0)
    assert first.stddev_c == pytest.approx(0.7071, abs=1e-4)
    assert (got[("dev2", T0)].messages, got[("dev2", T0)].avg_c) == (1, 30.0)


def test_a_python_job_file_gets_the_views(
    spark: SparkSession, kafka_bootstrap: str, log: str, tmp_path: Path
) -> None:
    job = tmp_path / "my_job.py"
    job.write_text(
        "from pyspark.sql import functions as F\n\n\n"
        "def job(views):\n"
        "    events = views.sql(\"SELECT client_id, 'event' AS what FROM events\")\n"
        "    seen = views.messages.select('client_id', F.lit('message').alias('what'))\n"
        "    return seen.union(events).groupBy('client_id', 'what').count()\n"
    )
    rows = run_query(spark, kafka_bootstrap, log, "run", str(job), output_mode="complete")
    assert sorted(tuple(r) for r in rows) == [
        ("dev1", "event", 4),
        ("dev1", "message", 3),
        ("dev2", "event", 3),
        ("dev2", "message", 2),
    ]


def test_results_to_a_kafka_topic_as_json(
    spark: SparkSession, kafka_bootstrap: str, log: str, tmp_path: Path
) -> None:
    out = f"test.out.{uuid.uuid4().hex[:8]}"
    ensure_topic(kafka_bootstrap, out, 1, {})
    options = JobOptions(
        job="sql",
        bootstrap=kafka_bootstrap,
        topic=log,
        sink="kafka",
        kafka_topic=out,
        checkpoint=str(tmp_path / "ckpt"),
        trigger=Trigger(available_now=True),
        shuffle_partitions=2,
        query="SELECT client_id, event FROM events WHERE client_id = 'dev2'",
    )
    run(options, spark, quiet=True)
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": out, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([out])
    got = []
    while len(got) < 3 and (msg := consumer.poll(10)) is not None:
        if not msg.error():
            got.append(json.loads(msg.value()))
    consumer.close()
    assert sorted(g["event"] for g in got) == ["connected", "connected", "disconnected"]
    assert {g["client_id"] for g in got} == {"dev2"}


@pytest.mark.parametrize(
    ("query", "spark_says"),
    [
        ("SELECT topic FROM messagez", "[TABLE_OR_VIEW_NOT_FOUND]"),
        ("SELEKT topic FROM messages", "[PARSE_SYNTAX_ERROR]"),
        ("SELECT nope FROM events", "[UNRESOLVED_COLUMN.WITH_SUGGESTION]"),
    ],
)
def test_a_bad_query_exits_2_with_sparks_message(
    spark: SparkSession,
    kafka_bootstrap: str,
    log: str,
    query: str,
    spark_says: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["analytics", "sql", query, "--bootstrap", kafka_bootstrap, "--topic", log]
    assert headwater_main([*argv, "--trigger", "available-now", "--shuffle-partitions", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headwater analytics: error: ") and spark_says in err
    assert "Traceback" not in err and "py4j" not in err


def test_flags_of_user_jobs_are_checked_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad_schema = tmp_path / "s.json"
    bad_schema.write_text(json.dumps({"type": "object", "properties": {"c": {"oneOf": []}}}))
    for argv, complaint in [
        (["sql"], "sql needs a QUERY"),
        (["run", str(tmp_path / "missing.py")], "run: no such file"),
        (["traffic", "SELECT 1"], "traffic takes no QUERY or FILE"),
        (["sql", "x.sql"], "sql: no such SQL file: x.sql"),
        (["sql", "SELECT 1", "--sink", "kafka", "--checkpoint", "c"], "--sink kafka needs"),
        (["sql", "SELECT 1", "--payload-schema", str(bad_schema)], "#/properties/c"),
        (["traffic", "--payload-schema", "c INT"], "options of sql and run"),
    ]:
        assert headwater_main(["analytics", *argv, "--bootstrap", "127.0.0.1:9"]) == 2, argv
        assert complaint in capsys.readouterr().err, argv
    (tmp_path / "list.json").write_text(json.dumps({"type": "array", "items": {"type": "number"}}))
    with pytest.raises(OptionsError, match="must be of"):
        payload_schema(str(tmp_path / "list.json"))
    nested = {
        "type": "object",
        "properties": {
            "at": {"type": "string", "format": "date-time"},
            "xs": {"type": "array", "items": {"type": ["integer", "null"]}},
            "o": {"type": "object", "properties": {"ok": {"type": "boolean"}}},
        },
    }
    (tmp_path / "nested.json").write_text(json.dumps(nested))
    ddl = payload_schema(str(tmp_path / "nested.json"))
    assert not isinstance(ddl, str)
    assert ddl.simpleString() == "struct<at:timestamp,xs:array<bigint>,o:struct<ok:boolean>>"


# --- the "Done when", as a user runs it ---------------------------------------------


DONE_WHEN_MESSAGES = (
    "SELECT topic, count(*), avg(CAST(get_json_object(CAST(payload AS STRING), "
    "'$.c') AS DOUBLE)) FROM messages GROUP BY topic"
)
DONE_WHEN_EVENTS = "SELECT client_id, event FROM events WHERE client_id = 'dev1'"


async def _command(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=240)
    text = out.decode()
    assert process.returncode == 0, f"{argv}: exit {process.returncode}\n{text}"
    return text


def console_rows(output: str) -> list[list[str]]:
    """The data rows of every table the console sink printed (header rows left out)."""
    rows: list[list[str]] = []
    in_table = expect_header = False
    for line in output.splitlines():
        if line.startswith("+"):
            if not in_table:
                in_table = expect_header = True
        elif line.startswith("|") and in_table:
            if expect_header:
                expect_header = False
            else:
                rows.append([cell.strip() for cell in line.strip("|").split("|")])
        else:
            in_table = False
    return rows


@pytest.fixture
async def default_log_node(kafka_bootstrap: str) -> AsyncIterator[tuple[Node, int]]:
    """A front-end node on the default log topic, reporting $SYS every second.  The session's
    Kafka is shared: another test may have made the default topic already, with its own count."""
    with contextlib.suppress(TopicMismatchError):
        ensure_topic(kafka_bootstrap, MESSAGES_TOPIC, PARTITIONS, messages_topic(PARTITIONS).config)
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "unused"})
    topics = consumer.list_topics(MESSAGES_TOPIC, timeout=10).topics
    partitions = len(topics[MESSAGES_TOPIC].partitions)
    consumer.close()
    config = NodeConfig(
        node_id="node1",
        host="127.0.0.1",
        port=0,
        kafka_bootstrap=kafka_bootstrap,
        redis_url=None,
        topic=MESSAGES_TOPIC,
        partitions=partitions,
    )
    config.sys_interval = 1.0
    node = Node(config)
    await node.start()
    yield node, partitions
    await node.stop()


async def test_the_done_when_commands_without_bootstrap(
    default_log_node: tuple[Node, int], kafka_bootstrap: str, tmp_path: Path
) -> None:
    node, partitions = default_log_node
    for c in (21, 22, 26):
        pub = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(node.config.port)]
        await _command(*pub, "-i", "dev1", "-t", "plant/dev1/temp", "-m", f'{{"c": {c}}}')
    produce(
        kafka_bootstrap,
        MESSAGES_TOPIC,
        [
            (event("connected", "dev1", T0, clean_session=True), record.EVENT),
            (event("disconnected", "dev1", T0 + 1, reason="client_disconnect"), record.EVENT),
            (event("connected", "dev2", T0 + 2, clean_session=True), record.EVENT),
        ],
        partitions,
    )

    def logged() -> list[Message]:
        return log_messages(kafka_bootstrap, MESSAGES_TOPIC)

    for _ in range(300):  # the publishes are QoS 0: wait for them, and for a $SYS report
        messages = await asyncio.to_thread(logged)
        temps = [m for m in messages if m.topic == "plant/dev1/temp"]
        if len(temps) >= 3 and any(m.topic.startswith("$SYS/") for m in messages):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the publishes or a $SYS report did not reach the log")
    values = [json.loads(m.payload)["c"] for m in temps]
    dev1_events = sorted(
        m.topic.removeprefix("$events/")
        for m in messages
        if m.topic.startswith("$events/") and m.client_id == "dev1"
    )

    # `make run`'s state file, naming this session's Kafka; no bootstrap in the environment
    write_state(
        tmp_path / ".headwater",
        ClusterState(
            ProcessRecord("dev up", os.getpid(), None), endpoints={"kafka": kafka_bootstrap}
        ),
    )
    env = {k: v for k, v in os.environ.items() if k != "HEADWATER_KAFKA_BOOTSTRAP"}
    shown = await _command(
        HEADWATER, "analytics", "sql", DONE_WHEN_MESSAGES, "--trigger", "available-now",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    by_topic = {row[0]: row[1:] for row in console_rows(shown)}
    assert by_topic["plant/dev1/temp"] == [str(len(values)), str(sum(values) / len(values))]
    assert not [t for t in by_topic if t.startswith("$")], shown
    shown = await _command(
        HEADWATER, "analytics", "sql", DONE_WHEN_EVENTS, "--trigger", "available-now",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    rows = console_rows(shown)
    assert sorted(name for _, name in rows) == dev1_events
    assert {"connected", "disconnected"} <= set(dev1_events)
    assert {client for client, _ in rows} == {"dev1"}
    assert re.search(r"headwater analytics: sql: \d+ batches", shown)
