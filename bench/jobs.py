"""Load-generator processes that run the jobs the parent sends them, one at a time, in order.

A :class:`Worker` is one spawned process with its own event loop (uvloop when installed) and its
open-file limit raised to the hard limit, so that each can hold ~18,000 sockets.  A job is any
picklable object with ``async run(state)``; the worker runs it, sends back its result (or the
traceback, raised in the parent as ``RuntimeError``) and waits for the next.  ``state`` is a dict
the jobs of one worker share, so what a job opened stays open for the next one, and whatever a job
left running in the background (a keep-alive pinger, a subscriber counting) goes on meanwhile.

Nothing outlives the parent: ``stop`` asks the worker to exit and terminates it if it does not;
a worker whose parent has gone sees its pipe close and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import multiprocessing.connection
import resource
import signal
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

State = dict[str, Any]
"""What the jobs of one worker share."""


class Job(Protocol[R_co]):
    async def run(self, state: State) -> R_co: ...


def work_directory(stack: contextlib.ExitStack, given: Path | None, prefix: str) -> Path:
    """Where a run keeps its logs and configs: ``given`` (made if missing), else a temporary
    directory removed when ``stack`` unwinds."""
    if given is None:
        return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    work = given.resolve()
    work.mkdir(parents=True, exist_ok=True)
    return work


def raise_file_limit() -> int:
    """Raise this process's soft limit on open files to the hard limit; return it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class Worker:
    """A load-generator process as the parent drives it."""

    def __init__(self, name: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=worker_entry, args=(child_conn,), name=f"bench-{name}", daemon=True
        )
        self.process.start()
        child_conn.close()
        self.submitted = 0
        self.answered = 0

    @property
    def pid(self) -> int:
        return self.process.pid or 0

    def submit(self, job: Job[Any]) -> None:
        self.conn.send(job)
        self.submitted += 1

    def result(self, timeout: float) -> Any:
        """The answer to the last job submitted; answers to earlier jobs whose result was given
        up on (a timeout) are skipped, so a late one is never taken for the next."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.conn.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"load worker {self.name}: no answer within {timeout:.0f} s")
            try:
                status, value = self.conn.recv()
            except (EOFError, OSError):
                raise RuntimeError(f"load worker {self.name} exited") from None
            self.answered += 1
            if self.answered == self.submitted:
                break
        if status == "error":
            last = str(value).strip().splitlines()[-1]
            raise RuntimeError(f"load worker {self.name} failed: {last}\n{value}")
        return value

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        end_process(self.process, self.conn, grace=5.0)


def run_all(workers: Sequence[Worker], jobs: Sequence[Job[R]], timeout: float) -> list[R]:
    """Run ``jobs[i]`` on ``workers[i]``, all at once; their results, in order."""
    for worker, job in zip(workers, jobs, strict=True):
        worker.submit(job)
    deadline = time.monotonic() + timeout
    return [worker.result(deadline - time.monotonic()) for worker in workers]


# -- the worker's side ------------------------------------------------------------------------


def worker_entry(conn: multiprocessing.connection.Connection) -> None:
    raise_file_limit()
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(conn))


async def serve(conn: multiprocessing.connection.Connection) -> None:
    loop = asyncio.get_running_loop()
    state: State = {}
    while True:
        try:
            job = await loop.run_in_executor(None, conn.recv)
        except EOFError:
            return
        if job is None:
            return
        try:
            answer: tuple[str, Any] = ("ok", await job.run(state))
        except Exception:
            answer = ("error", traceback.format_exc())
        conn.send(answer)


def install_signal_handlers() -> None:
    """SIGTERM, and SIGINT even where it was ignored (a background job), unwind the run."""

    def interrupt(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def end_process(
    process: multiprocessing.process.BaseProcess,
    conn: multiprocessing.connection.Connection,
    grace: float,
) -> None:
    """Wait ``grace`` seconds for a load process told to stop, then terminate it, then kill it;
    close its pipe."""
    process.join(grace)
    if process.is_alive():
        process.terminate()
        process.join(3.0)
    if process.is_alive():
        process.kill()
        process.join()
    conn.close()
