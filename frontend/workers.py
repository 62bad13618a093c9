"""A node of several processes (``--workers N``): a small parent and N workers sharing its ports.

With ``--workers N`` above 1 the process started is the parent.  It runs N workers, each
``python -m frontend`` with the same command line minus ``--workers``, plus ``--reuse-port`` (and
``HEADWATER_WORKERS=1`` in its environment, so neither the variable nor the configuration file
makes a worker a parent in turn), worker i as node ``NODE_ID-i`` with its HTTP port the stats port
+ i-1.  Every listener of a worker is bound with ``SO_REUSEPORT`` (``frontend.listeners``), so the
kernel spreads new connections over the workers.  Each worker is a whole node (its own producer,
reader, node id and lease), so a session moves from one worker to another exactly as between two
nodes (through Redis).

The parent does no MQTT work and holds no client state; one thread, one ``select`` over the
workers' stdout and a wake-up pipe for signals.  Invariants:

* it prints its ready line once every worker has printed its own (those follow); if a worker exits
  before then, the others are stopped and the parent exits with that worker's code, as a node that
  cannot start does;
* SIGTERM and SIGINT go on to every worker (each drains, ``frontend.node``) and nothing starts
  again; once all are gone the parent exits 0;
* SIGHUP goes on to every worker that is serving (one still starting reads the files anyway);
* a worker that exits on its own after that is started again after ``BACKOFF_FIRST`` seconds,
  doubling up to ``BACKOFF_MOST``, back to the first once it ran ``BACKOFF_RESET``; one log line
  per restart;
* a worker shares the parent's process group (a signal to the group reaches each worker too, and
  a worker told twice drains once) and gets SIGTERM if the parent dies (Linux
  ``PR_SET_PDEATHSIG``), so no worker outlives it holding the port.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import TextIO

from frontend.config import SETTINGS, NodeConfig, build_parser

log = logging.getLogger("headwater.workers")

WORKERS_FLAG = SETTINGS["workers"].flag
WORKERS_VARIABLE = SETTINGS["workers"].variable
BACKOFF_FIRST = 0.5
"""Seconds before a worker that exited is started again the first time."""
BACKOFF_MOST = 10.0
"""The longest wait between two starts of a worker that keeps exiting."""
BACKOFF_RESET = 30.0
"""Seconds a worker must have run for its next exit to wait ``BACKOFF_FIRST`` again."""
LONGEST_WAIT = 1.0
"""Seconds the parent sleeps at most between two looks at its workers."""
READY_MARK = b" ready on "
"""What a node's ready line (``frontend.node.serve``) holds."""
STOPS = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1


def worker_node_id(node_id: str, index: int) -> str:
    """The node id of worker ``index`` (1..N) of node ``node_id``."""
    return f"{node_id}-{index}"


def without_workers(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """``argv`` without ``--workers N``, ``--workers=N`` or an abbreviation argparse takes."""
    others = [name for name in parser._option_string_actions if name != WORKERS_FLAG]

    def names_workers(name: str) -> bool:
        return (
            len(name) > 2
            and WORKERS_FLAG.startswith(name)
            and not any(other.startswith(name) for other in others)
        )

    kept: list[str] = []
    skip = False
    for token in argv:
        name, equals, _ = token.partition("=")
        if skip:
            skip = False
        elif names_workers(name):
            skip = not equals
        else:
            kept.append(token)
    return kept


def worker_argv(
    argv: Sequence[str],
    config: NodeConfig,
    index: int,
    parser: argparse.ArgumentParser | None = None,
) -> list[str]:
    """The command of worker ``index`` (1..N) of the node ``argv`` and ``config`` describe: the
    same settings, its own node id and, when the stats port is fixed, its own HTTP port."""
    args = without_workers(argv, parser or build_parser())
    args += ["--node-id", worker_node_id(config.node_id, index), "--reuse-port"]
    if config.stats_host is not None and config.stats_port:
        args += ["--stats-listen", f"{config.stats_host}:{config.stats_port + index - 1}"]
    return [sys.executable, "-m", "frontend", *args]


def worker_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """A worker's environment: the parent's, with one worker."""
    return {**(os.environ if environ is None else environ), WORKERS_VARIABLE: "1"}


@dataclass(slots=True)
class Worker:
    """One worker: its command and its current process, if any."""

    index: int
    node_id: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    """When the current process started (the monotonic clock)."""
    serving: bool = False
    """The current process printed its ready line."""
    delay: float = 0.0
    """The last wait before a restart (0: none since it last ran long enough)."""
    due: float | None = None
    """When it is started again, if it is to be."""
    output: bytearray = field(default_factory=bytearray)
    """Its stdout not yet split into lines."""


def next_delay(previous: float, ran: float) -> float:
    """The wait before a process that ran ``ran`` seconds starts again, after a wait of
    ``previous`` (0: none) before its last start."""
    if previous == 0.0 or ran >= BACKOFF_RESET:
        return BACKOFF_FIRST
    return min(previous * 2, BACKOFF_MOST)


def retry_delay(previous: float) -> float:
    """The wait before trying again to start a process that did not start, after a wait of
    ``previous`` (``headwater``'s supervisor follows the same rules as the workers' parent)."""
    return min(max(previous * 2, BACKOFF_FIRST), BACKOFF_MOST)


class Parent:
    """Starts the workers, passes signals on, starts again those that exit on their own."""

    def __init__(
        self,
        workers: list[Worker],
        summary: str,
        env: dict[str, str],
        out: TextIO = sys.stdout,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.workers = workers
        self.summary = summary
        self.env = env
        self.out = out
        self.clock = clock
        self.selector = selectors.DefaultSelector()
        self.signals: list[int] = []
        self.stopping = False
        self.ready = False
        """Every worker has served once."""
        self.held: list[bytes] = []
        self.code = 0

    def run(self) -> int:
        """Run the workers until they are stopped; the exit code of the node."""
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        self.selector.register(wake_read, selectors.EVENT_READ, None)
        wakeup = signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
        caught = (*STOPS, signal.SIGHUP, signal.SIGCHLD)
        handlers = {sig: signal.signal(sig, self._on_signal) for sig in caught}
        try:
            for worker in self.workers:
                self._spawn(worker)
            log.info("%d workers: %s", len(self.workers), self._describe())
            return self._loop(wake_read)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(wakeup)
            self.selector.close()
            os.close(wake_read)
            os.close(wake_write)

    def _describe(self) -> str:
        return ", ".join(
            f"{w.node_id} (pid {w.process.pid if w.process else '-'})" for w in self.workers
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def _loop(self, wake: int) -> int:
        while True:
            for key, _ in self.selector.select(self._timeout()):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake, 512)
                else:
                    self._read(key.data)
            self._handle_signals()
            if self._reap():
                return self.code
            self._start_due()

    def _timeout(self) -> float:
        due = [w.due for w in self.workers if w.due is not None]
        return max(0.0, min([LONGEST_WAIT, *(when - self.clock() for when in due)]))

    def _spawn(self, worker: Worker) -> None:
        process = subprocess.Popen(
            worker.argv, stdout=subprocess.PIPE, env=self.env, preexec_fn=die_with_parent()
        )
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        self.selector.register(process.stdout.fileno(), selectors.EVENT_READ, worker)
        worker.process, worker.started, worker.due = process, self.clock(), None
        worker.serving = False
        worker.output.clear()

    def _read(self, worker: Worker) -> None:
        process = worker.process
        if process is None or process.stdout is None:
            return
        try:
            chunk = os.read(process.stdout.fileno(), 65536)
        except BlockingIOError:
            return
        if not chunk:
            with contextlib.suppress(KeyError):
                self.selector.unregister(process.stdout.fileno())
            return
        worker.output += chunk
        while (end := worker.output.find(b"\n")) >= 0:
            line = bytes(worker.output[: end + 1])
            del worker.output[: end + 1]
            self._line(worker, line)

    def _line(self, worker: Worker, line: bytes) -> None:
        if READY_MARK in line:
            worker.serving = True
        if self.ready:
            self._print(line.decode(errors="replace"))
            return
        self.held.append(line)
        if all(w.serving for w in self.workers):
            self.ready = True
            self._print(self.summary + "\n")
            for held in self.held:
                self._print(held.decode(errors="replace"))
            self.held.clear()

    def _print(self, text: str) -> None:
        with contextlib.suppress(OSError):
            self.out.write(text)
            self.out.flush()

    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.pop(0)
            if sig in STOPS:
                self._stop(sig)
            elif sig == signal.SIGHUP:
                serving = [w for w in self.workers if w.serving and w.process is not None]
                log.info("passing SIGHUP (reload) to %d workers", len(serving))
                for worker in serving:
                    self._signal(worker, signal.SIGHUP)

    def _stop(self, sig: int) -> None:
        if not self.stopping:
            log.info("stopping: %s to every worker", signal.Signals(sig).name)
        self.stopping = True
        for worker in self.workers:
            worker.due = None
            self._signal(worker, sig)

    def _signal(self, worker: Worker, sig: int) -> None:
        if worker.process is not None:
            with contextlib.suppress(ProcessLookupError):
                worker.process.send_signal(sig)

    def _reap(self) -> bool:
        """Notice the workers that exited; True once the parent is done."""
        for worker in self.workers:
            process = worker.process
            if process is None or (code := process.poll()) is None:
                continue
            self._read(worker)  # its last lines
            if process.stdout is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(process.stdout.fileno())
                process.stdout.close()
            worker.process, worker.serving = None, False
            self._exited(worker, process.pid, code)
        return self.stopping and all(w.process is None for w in self.workers)

    def _exited(self, worker: Worker, pid: int, code: int) -> None:
        if self.stopping:
            log.info("worker %s (pid %d) exited with %d", worker.node_id, pid, code)
        elif not self.ready:
            log.error(
                "worker %s (pid %d) exited with %d before serving; stopping the others",
                worker.node_id, pid, code,
            )  # fmt: skip
            self.code = code if code > 0 else 1
            self._stop(signal.SIGTERM)
        else:
            now = self.clock()
            worker.delay = next_delay(worker.delay, now - worker.started)
            worker.due = now + worker.delay
            log.warning(
                "worker %s (pid %d) exited with %d; restarting in %g s",
                worker.node_id, pid, code, worker.delay,
            )  # fmt: skip

    def _start_due(self) -> None:
        now = self.clock()
        for worker in self.workers:
            if worker.due is None or now < worker.due or self.stopping:
                continue
            try:
                self._spawn(worker)
            except OSError as exc:
                worker.delay = retry_delay(worker.delay)
                worker.due = now + worker.delay
                log.error("worker %s did not start (%s); trying again", worker.node_id, exc)


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to SIGTERM the child when its parent dies (Linux
    only; None elsewhere).  Everything is looked up before the fork: in the child, between fork
    and exec, only the prctl call and getppid run.  (``headwater``'s launchers use it too.)"""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def run_workers(argv: Sequence[str], config: NodeConfig, count: int) -> int:
    """Run node ``config`` as ``count`` workers until SIGTERM or SIGINT; the exit code."""
    parser = build_parser()
    workers = [
        Worker(i, worker_node_id(config.node_id, i), worker_argv(argv, config, i, parser))
        for i in range(1, count + 1)
    ]
    ids = ", ".join(worker.node_id for worker in workers)
    http = ""
    if config.stats_host is not None and config.stats_port:
        last = config.stats_port + count - 1
        http = f", HTTP on {config.stats_host}:{config.stats_port}..{last}"
    summary = (
        f"headwater node {config.node_id} ready on {config.host}:{config.port}: "
        f"{count} workers ({ids}){http}"
    )
    log.info("node %s runs as %d workers sharing its ports: %s", config.node_id, count, ids)
    return Parent(workers, summary, worker_environment()).run()
