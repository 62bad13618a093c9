"""The brokers under test, started as child processes on fresh loopback ports, always stopped.

* Headwater: ``headwater dev up`` (what ``make run`` runs), shelled out, never imported: Kafka,
  Redis, ``--nodes`` front-end nodes and HAProxy, in a state directory of the run's work directory.
  Its ``headwater.json`` names every child (pid, ports) and endpoint.  The load generators go to a
  node's own port, with the PROXY v2 header HAProxy would send (a node started with
  ``--proxy-protocol``, read from its ``/proc/<pid>/cmdline``), so a scenario chooses its node.
  Node settings not on ``dev up``'s command line are passed as ``HEADWATER_*`` variables, which
  the nodes inherit.  ``--headwater-rev REV`` runs ``dev up`` of commit REV, extracted with
  ``git archive`` into the work directory (the repository is not touched).
* mosquitto: Debian's ``mosquitto`` with a generated config (anonymous, no persistence, its own
  defaults otherwise: 20 messages in flight, 1000 queued per client).
* amqtt: its ``amqtt`` script, one TCP listener and anonymous auth.

Every child leads its own process group and is registered on the caller's ``ExitStack`` before it
is waited on, so an exception, Ctrl-C or SIGTERM at any point stops whatever was started.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import mqtt
from bench.mqtt import Endpoint

LOOPBACK = "127.0.0.1"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
REPO = Path(__file__).resolve().parent.parent
READY_LINE = "ready (Ctrl-C to stop)"


@dataclass
class Broker:
    """A running broker: where clients go, and which processes to measure."""

    name: str
    label: str
    endpoints: list[Endpoint]
    """Headwater: one per node (node 1 first); the others: their one listener."""
    pids: list[int]
    """The broker's own processes (Headwater: each node's)."""
    services: list[int] = field(default_factory=list)
    """Kafka and Redis (Headwater only)."""
    state: dict[str, str] = field(default_factory=dict)
    """Headwater: ``headwater.json``'s endpoints (kafka, redis, node stats URLs)."""
    stats: list[str] = field(default_factory=list)
    """Headwater: each node's ``GET /stats`` URL, in the order of ``endpoints``."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def spawn(
    stack: ExitStack,
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a process group of its own, output to ``log``; stopped on unwind."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env} if env else None,
            cwd=cwd,
            start_new_session=True,
        )
    stack.callback(stop, child)
    return child


def stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the child's group, SIGKILL if it is still there after ``STOP_TIMEOUT``."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 5.0)):
        if child.poll() is not None:
            return
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(wait)
        except subprocess.TimeoutExpired:
            continue


def tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_connack(at: Endpoint, timeout: float, child: subprocess.Popen[bytes], log: Path) -> None:
    """Until a CONNECT on ``at`` is answered; RuntimeError if the child exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"{log.stem} exited ({child.returncode}):\n{tail(log)}")
        try:
            with socket.create_connection((at.host, at.port), timeout=3) as s:
                s.sendall(at.hello() + mqtt.connect(f"probe-{os.getpid()}"))
                if s.recv(4)[:1] == b"\x20":
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{log.stem} did not answer CONNECT on {at.port} in {timeout:.0f} s")


# -- Headwater: headwater dev up ---------------------------------------------------------------


def git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def describe_checkout() -> str:
    """The commit of this checkout, and whether the product's code differs from it."""
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "frontend", "router", "mqttcore", "headwater")
    except (RuntimeError, OSError):
        return "this checkout (not a git repository)"
    changes = " with uncommitted changes" if dirty else ""
    return f"this checkout at {commit}{changes}{compiled(REPO)}"


def snapshot_source(rev: str, work: Path) -> tuple[Path, str]:
    """Extract commit ``rev`` into the work directory (``git archive``), so the cluster runs one
    fixed version while the checkout changes."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    target = work / f"headwater-{commit[:10]}"
    if not target.exists():
        target.mkdir(parents=True)
        archive = subprocess.Popen(["git", "archive", commit], cwd=REPO, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(target)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {commit} failed")
        if (target / "setup.py").exists():  # compile its hot path as `make install` would
            subprocess.run(
                [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                cwd=target, stdout=subprocess.DEVNULL, check=True,
            )  # fmt: skip
    return target, f"commit {commit[:10]} (`--headwater-rev {rev}`{compiled(target)})"


def compiled(source: Path) -> str:
    """How much of ``source``'s hot path runs compiled (setup.py's mypyc extensions)."""
    extensions = [
        path
        for package in ("mqttcore", "router", "frontend")
        for path in source.glob(f"{package}/**/*.so")
        if "__mypyc" not in path.name  # the library the compiled modules share
    ]
    return f", {len(extensions)} modules compiled" if extensions else ", pure Python"


@dataclass(frozen=True)
class Headwater:
    """How ``headwater dev up`` is run: which source, and what every cluster gets."""

    source: Path = REPO
    version: str = field(default_factory=describe_checkout)

    @classmethod
    def at(cls, rev: str | None, work: Path) -> Headwater:
        return cls(*snapshot_source(rev, work)) if rev else cls()

    @functools.cached_property
    def up_flags(self) -> frozenset[str]:
        """The options this source's ``dev up --help`` lists: all the launcher may pass."""
        help_text = subprocess.run(
            [sys.executable, "-m", "headwater", "dev", "up", "--help"],
            cwd=self.source,
            env={**os.environ, "PYTHONPATH": str(self.source)},
            capture_output=True,
            text=True,
            check=False,
        )
        return frozenset(re.findall(r"(?<![\w-])--[a-z][\w-]*", help_text.stdout))

    def check_flags(self, argv: Sequence[str]) -> None:
        """RuntimeError naming any option of ``argv`` this version's ``dev up`` lacks."""
        missing = [a.split("=")[0] for a in argv if a.startswith("--") and a.split("=")[0]
                   not in self.up_flags]  # fmt: skip
        if missing:
            raise RuntimeError(f"`headwater dev up` of {self.version} has no {', '.join(missing)}")

    def start(
        self,
        work: Path,
        stack: ExitStack,
        nodes: int = 1,
        workers: int = 1,
        env: Mapping[str, str] | None = None,
        up_args: Sequence[str] = (),
    ) -> Broker:
        """A ``dev up`` cluster of ``nodes`` nodes, serving once this returns."""
        state_dir = work / f"cluster-{time.monotonic_ns()}"
        argv = [sys.executable, "-m", "headwater", "dev", "up", "--nodes", str(nodes)]
        argv += ["--port", str(free_port()), "--state-dir", str(state_dir), *up_args]
        argv += [a for f in ("--tls-port", "--ws-port") if f in self.up_flags for a in (f, "0")]
        argv += ["--workers", str(workers)] if workers > 1 else []
        self.check_flags(argv)
        log = state_dir.with_suffix(".log")
        child_env = {**(env or {}), "PYTHONPATH": str(self.source)}
        stack.callback(drop_kafka_data, state_dir)  # after the cluster stops (the stack unwinds)
        up = spawn(stack, argv, log, child_env, self.source)
        state = wait_state(state_dir / "headwater.json", up, log)
        nodes_found = sorted(c["name"] for c in state["children"] if c["name"].startswith("node"))
        by_name = {c["name"]: c for c in state["children"]}
        node_recs = [by_name[n] for n in nodes_found]
        endpoints = [Endpoint(LOOPBACK, r["ports"][0], behind_proxy(r["pid"])) for r in node_recs]
        for at in endpoints:
            wait_connack(at, START_TIMEOUT, up, log)
        services = [by_name[n]["pid"] for n in ("kafka", "redis") if n in by_name]
        label = f"Headwater ({nodes} node{'s' if nodes > 1 else ''})"
        stats = [state["endpoints"].get(f"{n} stats", "") for n in nodes_found]
        return Broker(
            "headwater", label, endpoints, [r["pid"] for r in node_recs], services,
            dict(state["endpoints"]), stats,
        )  # fmt: skip


def drop_kafka_data(state_dir: Path) -> None:
    """A stopped cluster's Kafka data (each broker's log directory, the one holding
    ``meta.properties``): 0.4-0.5 GB a run of the throughput scenarios, which a work dir kept
    between runs would pile up (64 GB in a day of A/B runs here).  Its logs stay."""
    for meta in list(state_dir.rglob("meta.properties")):  # found, then removed
        shutil.rmtree(meta.parent, ignore_errors=True)


def wait_state(path: Path, up: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    """``headwater.json`` once ``dev up`` says it is ready."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise RuntimeError(f"headwater dev up exited ({up.returncode}):\n{tail(log)}")
        if READY_LINE in tail(log, 50) and path.exists():
            found: dict[str, Any] = json.loads(path.read_text())
            return found
        time.sleep(0.2)
    raise RuntimeError(f"headwater dev up not ready in {START_TIMEOUT:.0f} s:\n{tail(log)}")


def behind_proxy(pid: int) -> bool:
    """Whether the node was started with ``--proxy-protocol``."""
    try:
        return b"--proxy-protocol" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


# -- mosquitto and amqtt -----------------------------------------------------------------------


def program(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/local/sbin:/sbin")
    if found is None:
        raise RuntimeError(f"{name} is not installed")
    return found


def mosquitto_version() -> str:
    try:
        out = subprocess.run([program("mosquitto"), "-h"], capture_output=True, text=True)
    except RuntimeError:
        return "not installed"
    first = (out.stdout or out.stderr).splitlines()[:1]
    return first[0].replace("mosquitto version ", "") if first else "?"


def start_mosquitto(work: Path, stack: ExitStack, extra: Sequence[str] = ()) -> Broker:
    """mosquitto with its defaults, anonymous, no persistence; plus the config lines ``extra``."""
    port = free_port()
    conf = work / f"mosquitto-{port}.conf"
    lines = [f"listener {port} {LOOPBACK}", "allow_anonymous true", "persistence false"]
    lines += ["log_dest stderr", "log_type error", "log_type warning", *extra]
    conf.write_text("\n".join(lines) + "\n")
    log = conf.with_suffix(".log")
    child = spawn(stack, [program("mosquitto"), "-c", str(conf)], log)
    at = Endpoint(LOOPBACK, port)
    wait_connack(at, 15, child, log)
    return Broker("mosquitto", f"mosquitto {mosquitto_version()}", [at], [child.pid])


def amqtt_version() -> str:
    try:
        import amqtt
    except ImportError:
        return "not installed"
    return str(amqtt.__version__)


def start_amqtt(work: Path, stack: ExitStack) -> Broker:
    script = Path(sys.executable).with_name("amqtt")
    if not script.exists():
        raise RuntimeError(f"amqtt is not installed next to {sys.executable}")
    port = free_port()
    conf = work / f"amqtt-{port}.yaml"
    conf.write_text(
        f"listeners:\n  default:\n    type: tcp\n    bind: {LOOPBACK}:{port}\nplugins:\n"
        "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n"
    )
    log = conf.with_suffix(".log")
    child = spawn(stack, [str(script), "-c", str(conf)], log)
    at = Endpoint(LOOPBACK, port)
    wait_connack(at, 30, child, log)
    return Broker("amqtt", f"amqtt {amqtt_version()}", [at], [child.pid])


def start(name: str, work: Path, stack: ExitStack, headwater: Headwater, nodes: int = 1) -> Broker:
    """The broker ``name`` with the run's defaults."""
    if name == "headwater":
        return headwater.start(work, stack, nodes)
    return start_mosquitto(work, stack) if name == "mosquitto" else start_amqtt(work, stack)
