"""The commands README.md and docs/analytics.md show, run as shown against a dev cluster this test
starts (`headwater dev up --nodes 2`, state dir `.headwater` in a scratch directory that is the
commands' working directory, on the session's Kafka and Redis).

Every command of a ```sh block is in `PLAN`, so a command added to a document fails
`test_every_shown_command_has_a_plan` until it is given one. The plans:

* run: through bash, exit 0, the output matching the plan's pattern;
* stays: a subscriber (`mosquitto_sub`) started in the background, which must print what the
  plan expects once the command after it has published, then is stopped;
* flags: an analytics job, its flags checked as `headwater analytics` checks them before Spark
  starts (`spark_streaming.cli.checked_options`), with the Kafka found as the command finds it:
  from the running cluster's state file (no HEADWATER_KAFKA_BOOTSTRAP). Starting Spark takes half
  a minute a job; one job of analytics.md runs for real, under the `spark` marker;
* skip: with the reason (`make run` is the cluster itself; `make test` is the suite; Docker and
  spark-submit need what the test does not start; installers change the machine).

The only edits made to a command: the default ports 1883 and 8883 become the cluster's (tests
never use 1883), and `make analytics ...` is expanded by `make -n` to the command it runs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from headwater.devcluster.state import running_kafka
from tests.conftest import free_port
from tests.integration.test_dev_cluster import DevUp

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ANALYTICS = ROOT / "docs" / "analytics.md"
BIN = str(Path(sys.executable).parent)


@dataclass(frozen=True)
class Plan:
    kind: str  # run, stays, flags, skip
    expect: str = ""
    """run: a pattern of the output; stays: what the subscriber prints; skip: why."""


SKIP_MAKE = Plan("skip", "make run is the cluster this test starts; make test is the suite")
SKIP_DOCKER = Plan("skip", "Docker: tests/e2e/test_compose_stack.py starts the stack")
SKIP_CLUSTER = Plan(
    "skip", "needs a Spark cluster and HDFS; the job's flags are those checked here"
)
FLAGS = Plan("flags")

PLAN: dict[str, Plan] = {
    # README
    "make run": SKIP_MAKE,
    "make test": SKIP_MAKE,
    "make run RUN_ARGS=\"--export 'plant/#=plant.json:json'\"": SKIP_MAKE,
    "mosquitto_sub --cafile .headwater/certs/ca.crt -h 127.0.0.1 -p 8883 -t '#' -v": Plan(
        "stays", "t over-tls"
    ),
    "headwater dev status": Plan("run", r"node1 +\d+ running"),
    "headwater dev restart node1": Plan("run", ""),
    "headwater dev roll": Plan("run", ""),
    "make compose-up": SKIP_DOCKER,
    "make compose-down": SKIP_DOCKER,
    "mosquitto_sub -h 127.0.0.1 -p 8883 --cafile .headwater/compose/ca.crt -t 'analytics/#' -v": (
        SKIP_DOCKER
    ),
    "cp docker/env.example docker/.env": SKIP_DOCKER,
    "docker compose -f docker/docker-compose.yml up -d --build": SKIP_DOCKER,
    "docker compose -f docker/docker-compose.yml --profile grafana up -d": SKIP_DOCKER,
    "docker compose -f docker/docker-compose.yml cp certs-init:/certs/ca.crt headwater-ca.crt": (
        SKIP_DOCKER
    ),
    "docker compose -f docker/docker-compose.yml down": SKIP_DOCKER,
    "mosquitto_sub -h 127.0.0.1 -p 1883 -t 'sensors/#' -q 1 -v -c -i dashboard": Plan(
        "stays", "sensors/dev42/temp 21.5"
    ),
    "mosquitto_pub -h 127.0.0.1 -p 1883 -t sensors/dev42/temp -m 21.5 -q 1 -r": Plan("run"),
    "mosquitto_sub -h 127.0.0.1 -p 1883 -t '$share/workers/jobs/+/run' -q 1": Plan(
        "stays", "job-1"
    ),
    "mosquitto_sub -h 127.0.0.1 -p 1883 -t '$history/10m/sensors/#' -q 1 -v": Plan(
        "stays", "$history/10m/sensors/dev42/temp 21.5"
    ),
    "headwater stats": Plan("run", r"node\d"),
    "mosquitto_pub --cafile .headwater/certs/ca.crt -h 127.0.0.1 -p 8883 -t t -m over-tls": Plan(
        "run"
    ),
    "headwater passwd -c passwd alice": Plan("run"),
    "headwater passwd -b passwd bob 's3cret'": Plan("run"),
    "headwater passwd -D passwd bob": Plan("run"),
    "headwater passwd -H sha512 -b passwd old pw": Plan("run"),
    "mosquitto_sub -h 127.0.0.1 -p 1883 -t '$SYS/broker/clients/connected' -v": Plan(
        "stays", "$SYS/broker/clients/connected "
    ),
    "mosquitto_sub -h 127.0.0.1 -p 1883 -t '$SYS/brokers/+/clients/connected' -v": Plan(
        "stays", "/clients/connected "
    ),
    "headwater analytics traffic --sink console": FLAGS,
    "headwater analytics traffic --sink mqtt --checkpoint .headwater/analytics/traffic-mqtt.ckpt": (
        FLAGS
    ),
    "headwater analytics top_publishers --window '5 minutes' --top 20": FLAGS,
    "make analytics ANALYTICS_JOB=device_silence": FLAGS,
    'headwater analytics sql "SELECT client_id, count(*) FROM messages GROUP BY client_id" '
    "--trigger available-now": FLAGS,
    # docs/analytics.md
    "make install": Plan("skip", "installs packages on the machine: the suite runs on its result"),
    "headwater analytics traffic": FLAGS,
    "headwater analytics traffic --trigger available-now --sink parquet "
    "--output .headwater/analytics/traffic --checkpoint .headwater/analytics/traffic.ckpt": FLAGS,
    "mosquitto_sub -p 1883 -t 'analytics/#' -v": Plan("skip", "waits for Spark's first batch"),
    "headwater analytics device_silence --window '1 minute' --lookback 10 --min-active 5 "
    "--silence '5 minutes'": FLAGS,
    "make analytics": FLAGS,
    'make analytics ANALYTICS_JOB=top_publishers ANALYTICS_ARGS="--trigger available-now"': FLAGS,
    "mkdir -p dist && python -m zipfile -c dist/spark_streaming.zip spark_streaming": SKIP_CLUSTER,
    "PYTHONPATH=$PWD PYSPARK_PYTHON=python3 spark-submit --master spark://spark-master:7077 "
    "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0,"
    "org.apache.spark:spark-avro_2.13:4.0.0 --conf spark.jars.ivy=$HOME/.cache/headwater/ivy "
    "--conf spark.jars.ivySettings=$HOME/.cache/headwater/ivy/ivysettings.xml "
    "--py-files dist/spark_streaming.zip spark_streaming/cli.py traffic "
    "--bootstrap kafka-1:9092,kafka-2:9092 --sink parquet --output hdfs:///headwater/traffic "
    "--checkpoint hdfs:///headwater/checkpoints/traffic": SKIP_CLUSTER,
    ".venv/bin/pytest -m spark tests/spark": Plan("skip", "the Spark tests themselves"),
    # docs/analytics.md, your own jobs
    "mosquitto_pub -p 1883 -i dev1 -t plant/dev1/temp -m '{\"c\": 21}'": Plan("run"),
    "mosquitto_pub -p 1883 -i dev1 -t plant/dev1/temp -m '{\"c\": 23}'": Plan("run"),
    'headwater analytics sql "SELECT topic, count(*), avg(CAST(get_json_object(CAST(payload AS '
    "STRING), '$.c') AS DOUBLE)) FROM messages GROUP BY topic\" --trigger available-now": FLAGS,
    'headwater analytics sql "SELECT client_id, event FROM events WHERE client_id = '
    "'dev1'\" --trigger available-now": FLAGS,
    "headwater analytics sql devices_online.sql --trigger available-now": FLAGS,
    "headwater analytics sql device_stats.sql --window '1 minute' --trigger available-now": FLAGS,
    "headwater analytics sql device_stats.sql --sink parquet --output .headwater/analytics/stats "
    "--checkpoint .headwater/analytics/stats.ckpt": FLAGS,
    "headwater analytics run per_device.py --trigger available-now": Plan(
        "skip", "runs the file shown above; tests/spark/test_user_jobs.py runs a job file"
    ),
}


def shown_commands(path: Path) -> list[str]:
    """The commands of a document's ```sh blocks: continued lines joined, comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", path.read_text(), re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"(^|\s+)#(?![^']*'\s).*$", "", line).strip()
            if command:
                commands.append(" ".join(command.split()))
    return commands


def plan_of(command: str) -> Plan | None:
    return PLAN.get(command)


def test_every_shown_command_has_a_plan() -> None:
    shown = shown_commands(README) + shown_commands(ANALYTICS)
    assert [c for c in shown if plan_of(c) is None] == []
    assert len(shown) >= 30


# --- against a cluster ---------------------------------------------------------------------


@dataclass
class Here:
    """The working directory of the commands, and the cluster running from it."""

    cwd: Path
    cluster: DevUp
    env: dict[str, str]

    def localize(self, command: str) -> str:
        command = command.replace("-p 1883", f"-p {self.cluster.port}")
        return command.replace("-p 8883", f"-p {self.cluster.tls_port}")

    def run(self, command: str, stdin: str = "", timeout: float = 90.0) -> str:
        done = subprocess.run(
            ["bash", "-c", self.localize(command)],
            cwd=self.cwd,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=True,  # no terminal: getpass reads the password from stdin
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{output}"
        return output

    def start(self, command: str) -> Subscriber:
        log = self.cwd / f"sub-{time.monotonic_ns()}.out"
        with log.open("w") as out:
            process = subprocess.Popen(
                ["bash", "-c", "exec " + self.localize(command)],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        return Subscriber(command, process, log)


@dataclass
class Subscriber:
    command: str
    process: subprocess.Popen[str]
    log: Path

    def saw(self, text: str) -> bool:
        return text in self.log.read_text()

    def wait_for(self, text: str, timeout: float = 20.0, fail: bool = True) -> None:
        deadline = time.monotonic() + timeout
        while not self.saw(text):
            assert self.process.poll() is None, f"{self.command} exited: {self.log.read_text()}"
            if time.monotonic() >= deadline:
                assert not fail, f"{self.command}: no {text!r} in {timeout} s"
                return
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(10)


@pytest.fixture
def here(tmp_path: Path, kafka_bootstrap: str, redis_url: str) -> Iterator[Here]:
    up_env = {k: v for k, v in os.environ.items() if k != "HEADWATER_PORT"}
    up_env |= {"HEADWATER_KAFKA_BOOTSTRAP": kafka_bootstrap, "HEADWATER_REDIS_URL": redis_url}
    cluster = DevUp(tmp_path / ".headwater", free_port(), up_env, nodes=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADWATER_")}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    try:
        cluster.wait_ready(timeout=120)
        yield Here(tmp_path, cluster, env)
    finally:
        if cluster.process.poll() is None:
            cluster.process.send_signal(signal.SIGTERM)
            cluster.process.wait(60)


def _plan(command: str, kind: str) -> Plan:
    plan = plan_of(command)
    assert plan is not None and plan.kind == kind, (command, plan)
    return plan


def test_readme_commands_run_against_a_dev_cluster(here: Here) -> None:
    shown = shown_commands(README)
    subscribers = [here.start(c) for c in shown if _kind(c) == "stays"]
    publishes = [c for c in shown if c.startswith("mosquitto_pub") and _kind(c) == "run"]
    shared = f"mosquitto_pub -h 127.0.0.1 -p {here.cluster.port} -t jobs/a/run -m job-1 -q 1"
    try:
        for sub in subscribers:  # until each is subscribed: what it expects is published again
            expect = _plan(sub.command, "stays").expect
            deadline = time.monotonic() + 30
            while not sub.saw(expect):
                assert time.monotonic() < deadline, f"{sub.command}: no {expect!r}"
                for command in publishes:
                    here.run(command)
                here.run(shared)
                sub.wait_for(expect, timeout=1.0, fail=False)
    finally:
        for sub in subscribers:
            sub.stop()
    for command in shown:
        plan = plan_of(command)
        if plan is not None and plan.kind == "run" and command.startswith("headwater "):
            stdin = "pw-1\npw-1\n" if " -c " in command else ""
            output = here.run(command, stdin=stdin)
            assert re.search(plan.expect, output), f"{command}: {output}"
    assert "alice:$7$" in (here.cwd / "passwd").read_text()


def _kind(command: str) -> str:
    plan = plan_of(command)
    return plan.kind if plan is not None else ""


def _analytics_argv(here: Here, command: str) -> list[str]:
    if command.startswith("make analytics"):
        dry = subprocess.run(
            ["make", "-n", "-s", *shlex.split(command)[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        command = next(ln for ln in dry.stdout.splitlines() if "headwater analytics" in ln)
        command = command.split("headwater", 1)[1].strip()
        command = "headwater " + command
    argv = shlex.split(command)
    assert argv[:2] == ["headwater", "analytics"], command
    return argv[2:]


def test_analytics_commands_find_the_dev_clusters_kafka_and_pass_their_checks(here: Here) -> None:
    """Every analytics command of both documents: flags accepted, Kafka found from `.headwater`."""
    from spark_streaming.cli import checked_options

    kafka = running_kafka(here.cwd / ".headwater")
    assert kafka is not None
    old_cwd = Path.cwd()
    os.chdir(here.cwd)
    try:
        for command in shown_commands(README) + shown_commands(ANALYTICS):
            if plan_of(command) is FLAGS:
                options = checked_options(_analytics_argv(here, command), kafka)
                assert options.bootstrap == kafka, command
    finally:
        os.chdir(old_cwd)


@pytest.mark.spark
def test_the_available_now_parquet_job_of_analytics_md_runs_as_shown(here: Here) -> None:
    """One job for real, as a user runs it: Spark starts, reads the log, writes Parquet."""
    command = next(c for c in shown_commands(ANALYTICS) if "--trigger available-now --sink" in c)
    here.run("mosquitto_pub -h 127.0.0.1 -p 1883 -t plant/line1/temp -m 1 -q 1")
    output = here.run(command, timeout=300)
    assert "headwater analytics: traffic:" in output
    assert (here.cwd / ".headwater" / "analytics" / "traffic" / "_spark_metadata").is_dir()
