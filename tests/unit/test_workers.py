"""``--workers N`` (``frontend.workers``): the setting and its checks, each worker's command line,
the parent's supervision of real (stand-in) worker processes, and what ``dev up`` makes of it."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from frontend.config import NodeConfig, config_from_args, workers_setting
from frontend.config_file import parse_args
from frontend.values import ConfigError
from frontend.workers import (
    BACKOFF_FIRST,
    BACKOFF_MOST,
    Parent,
    Worker,
    next_delay,
    without_workers,
    worker_argv,
    worker_environment,
)
from headwater.cli import build_parser as cli_parser
from headwater.devcluster import nodes
from headwater.devcluster.nodes import NodeSpec, node_specs
from headwater.devcluster.state import ProcessRecord
from headwater.services.ports import free_port

REQUIRED = ["--node-id", "n", "--kafka-bootstrap", "k:9092", "--listen", "127.0.0.1:1883"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("HEADWATER_")]:
        monkeypatch.delenv(name)


def settings(argv: list[str]) -> tuple[NodeConfig, int]:
    args = parse_args([*REQUIRED, *argv])
    config = config_from_args(args)
    return config, workers_setting(args, config)


def refusal(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        settings(argv)
    assert "--workers" in str(caught.value)
    return str(caught.value)


# -- the setting ------------------------------------------------------------------------------


def test_one_worker_by_default_and_n_from_flag_variable_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert settings([])[1] == 1
    assert settings(["--workers", "4"])[1] == 4
    path = tmp_path / "h.toml"
    path.write_text("workers = 3\n")
    assert settings(["--config", str(path)])[1] == 3
    monkeypatch.setenv("HEADWATER_WORKERS", "2")
    assert settings(["--config", str(path)])[1] == 2  # the variable over the file


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workers", "0"], "0 is outside 1..64"),
        (["--workers", "65"], "65 is outside 1..64"),
        (["--workers", "two"], "'two' is not an integer"),
        (["--workers", "2", "--listen", "127.0.0.1:0"], "the mqtt port, which must not be 0"),
        (
            ["--workers", "2", "--ws-listen", "127.0.0.1:0"],
            "the ws port, which must not be 0",
        ),
        (
            ["--workers", "3", "--stats-listen", "127.0.0.1:65534"],
            "HTTP ports 65534..65536 go beyond 65535",
        ),
        (
            ["--workers", "4", "--stats-listen", "127.0.0.1:1880"],
            "HTTP ports 1880..1883 include the mqtt port 1883",
        ),
    ],
)
def test_bad_values_stop_start_up_naming_workers(argv: list[str], says: str) -> None:
    assert says in refusal(argv)


def test_a_bad_value_from_the_file_names_the_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "h.toml"
    path.write_text("workers = 0\n")
    assert f"workers in {path}" in refusal(["--config", str(path)])


def test_one_worker_may_listen_on_port_0() -> None:
    assert settings(["--listen", "127.0.0.1:0", "--stats-listen", "127.0.0.1:0"])[1] == 1


def test_main_refuses_a_bad_value_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    from frontend.node import main

    assert main([*REQUIRED, "--workers", "0"]) == 2
    assert "--workers / HEADWATER_WORKERS: 0 is outside 1..64" in capsys.readouterr().err


# -- each worker's command line -----------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--workers", "2", "--topic", "t"],
        ["--workers=2", "--topic", "t"],
        ["--work", "2", "--topic", "t"],
        ["--topic", "t", "--wor=2", "--workers", "3"],
    ],
)
def test_the_workers_flag_is_taken_out_in_every_spelling(argv: list[str]) -> None:
    from frontend.config import build_parser

    assert without_workers(argv, build_parser()) == ["--topic", "t"]


def test_worker_i_is_node_id_i_on_http_port_plus_i_minus_1() -> None:
    argv = [*REQUIRED, "--workers", "3", "--stats-listen", "127.0.0.1:9100", "--topic", "t"]
    config, _ = settings(argv[len(REQUIRED) :])
    command = worker_argv(argv, config, 3)
    assert command[:3] == [sys.executable, "-m", "frontend"]
    assert "--workers" not in command
    args = parse_args(command[3:])
    assert args.node_id == "n-3"
    assert args.stats_listen == "127.0.0.1:9102"
    assert args.listen == "127.0.0.1:1883" and args.topic == "t"


def test_a_worker_is_one_worker_whatever_the_variable_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "h.toml"
    path.write_text('workers = 4\nnode-id = "filed"\nkafka-bootstrap = "k:9092"\n')
    monkeypatch.setenv("HEADWATER_STATS_LISTEN", "127.0.0.1:0")
    argv = ["--config", str(path), "--listen", "127.0.0.1:1883"]
    config, workers = settings(["--config", str(path)])
    assert workers == 4
    command = worker_argv(argv, config, 2)
    assert "--stats-listen" not in command  # port 0: each worker is given its own
    env = worker_environment(dict(os.environ))
    assert env["HEADWATER_WORKERS"] == "1"
    monkeypatch.setenv("HEADWATER_WORKERS", env["HEADWATER_WORKERS"])
    args = parse_args(command[3:])
    worker_config = config_from_args(args)
    assert workers_setting(args, worker_config) == 1
    assert worker_config.node_id == "n-2"


def test_backoff_doubles_to_the_most_and_starts_over_after_a_long_run() -> None:
    delays = [BACKOFF_FIRST]
    for _ in range(6):
        delays.append(next_delay(delays[-1], ran=1.0))
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert next_delay(BACKOFF_MOST, ran=60.0) == BACKOFF_FIRST


# -- the parent, with stand-in workers ------------------------------------------------------------

STAND_IN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
signal.signal(signal.SIGHUP, lambda *_: print(sys.argv[1], "reloaded", flush=True))
if sys.argv[2] == "fail":
    sys.exit(3)
print("headwater node", sys.argv[1], "ready on here", flush=True)
while True:
    time.sleep(1)
"""


def stand_ins(*modes: str) -> list[Worker]:
    return [
        Worker(i, f"w-{i}", [sys.executable, "-c", STAND_IN, f"w-{i}", mode])
        for i, mode in enumerate(modes, 1)
    ]


def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def drive() -> Iterator[Callable[[Callable[[], None]], None]]:
    """Run ``steps`` on a thread while the parent runs on this (the main) thread; SIGTERM to this
    process at the end whatever happens, so the parent always stops."""
    threads: list[threading.Thread] = []
    failures: list[BaseException] = []

    def start(steps: Callable[[], None]) -> None:
        def run() -> None:
            try:
                steps()
            except BaseException as exc:
                failures.append(exc)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)

        thread = threading.Thread(target=run)
        threads.append(thread)
        thread.start()

    yield start
    for thread in threads:
        thread.join(30)
    if failures:
        raise failures[0]


def test_the_parent_passes_signals_on_and_restarts_a_worker_that_died(
    drive: Callable[[Callable[[], None]], None], caplog: pytest.LogCaptureFixture
) -> None:
    out = io.StringIO()
    workers = stand_ins("serve", "serve")
    parent = Parent(workers, "headwater node w ready on here: 2 workers", dict(os.environ), out)
    pids: list[int] = []

    def steps() -> None:
        until(lambda: "2 workers" in out.getvalue(), "the ready line")
        lines = out.getvalue().splitlines()
        assert lines[0] == "headwater node w ready on here: 2 workers"
        assert sorted(lines[1:]) == [
            "headwater node w-1 ready on here",
            "headwater node w-2 ready on here",
        ]
        os.kill(os.getpid(), signal.SIGHUP)
        until(lambda: out.getvalue().count("reloaded") == 2, "both workers to reload")
        process = workers[1].process
        assert process is not None
        pids.append(process.pid)
        os.kill(process.pid, signal.SIGKILL)
        until(lambda: out.getvalue().count("w-2 ready on here") == 2, "w-2 to start again")
        assert workers[1].process is not None and workers[1].process.pid != pids[0]
        pids.append(workers[0].process.pid if workers[0].process else 0)
        pids.append(workers[1].process.pid)

    drive(steps)
    started = time.monotonic()
    assert parent.run() == 0
    assert time.monotonic() - started >= BACKOFF_FIRST
    assert all(w.process is None for w in workers)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    restarts = [r.getMessage() for r in caplog.records if "restarting in" in r.getMessage()]
    assert restarts == [f"worker w-2 (pid {pids[0]}) exited with -9; restarting in 0.5 s"]


def test_a_worker_that_cannot_start_stops_the_node_with_its_code() -> None:
    out = io.StringIO()
    workers = stand_ins("serve", "fail")
    parent = Parent(workers, "never", dict(os.environ), out)
    assert parent.run() == 3
    assert "never" not in out.getvalue()
    assert all(w.process is None for w in workers)


# -- dev up ---------------------------------------------------------------------------------------


def test_dev_up_gives_each_node_its_workers_on_consecutive_http_ports() -> None:
    specs = node_specs(3, "k:9092", "redis://r:6379/0", 12, tls=True, ws=True, workers=3)
    ports = [p for s in specs for p in (s.port, s.tls_port, s.ws_port, *s.stats_ports)]
    assert len(set(ports)) == len(ports) == 3 * 6
    for spec in specs:
        assert spec.stats_ports == [spec.stats_port + i for i in range(3)]
        argv = spec.argv()
        assert argv[argv.index("--workers") + 1] == "3"
    assert list(specs[0].worker_stats_urls()) == ["node0-1", "node0-2", "node0-3"]
    one = NodeSpec("node0", 1, "k", "r", 12, 9100)
    assert one.worker_stats_urls() == {"node0": "http://127.0.0.1:9100/stats"}


def test_a_nodes_record_knows_every_workers_ready_port() -> None:
    record = ProcessRecord("node0", 1, None, ready_port=9100, workers=2)
    assert record.ready_ports == [9100, 9101]
    assert (
        ProcessRecord.from_json({"name": "kafka", "pid": 2, "start_ticks": None}).ready_ports == []
    )
    old = ProcessRecord.from_json({"name": "node1", "pid": 3, "start_ticks": 4, "ready_port": 80})
    assert old.ready_ports == [80]


def test_dev_up_takes_workers_in_range() -> None:
    assert cli_parser().parse_args(["dev", "up", "--workers", "4"]).workers == 4
    for bad in ("0", "65"):
        with pytest.raises(SystemExit):
            cli_parser().parse_args(["dev", "up", "--workers", bad])


def test_dev_status_shows_every_workers_ready_answer() -> None:
    from headwater.devcluster.control import _status_line

    port = free_port()
    record = ProcessRecord("node0", os.getpid(), None, ready_port=port, workers=2)
    assert _status_line(record, time.time()).endswith("ready: 1: down, 2: down")


def test_node_ports_never_take_the_clusters_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """HAProxy binds the cluster's ports after the nodes started: a node on one of them would
    make it fail (seen once in a suite: "cannot bind socket (Address already in use)")."""
    offered = iter([41000, 41001, 41002, 41000, 41003, 41004, 41005, 41006, 41007] * 20)
    monkeypatch.setattr(nodes, "free_port", lambda: next(offered))
    monkeypatch.setattr(nodes, "_is_free", lambda port: True)
    specs = node_specs(1, "k:9092", "redis://r:6379/0", 12, tls=True, ws=True,
                       avoid=frozenset({41001, 41004}))  # fmt: skip
    used = {specs[0].port, specs[0].tls_port, specs[0].ws_port, specs[0].stats_port}
    assert not used & {41001, 41004} and len(used) == 4
