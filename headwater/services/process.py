"""Child processes that can always be stopped, even by another process later.

A child is spawned as the leader of a new session (so its process group id is its pid): a terminal's
Ctrl-C reaches only the parent, and `stop()` signals the whole group, grandchildren included, with
SIGTERM and then SIGKILL after a grace period. A group is signalled only while its leader's pid is
known to be ours (running, or a zombie not reaped yet). Output goes to a log file, never to a pipe
that could fill up.

A child also gets SIGTERM if the thread that spawned it dies (Linux PR_SET_PDEATHSIG), so a parent
killed with SIGKILL (a test runner's timeout, `kill -9`) leaves no orphaned JVM behind. The signal
follows the spawning *thread*: spawn long-lived children from the main thread or a thread that
lives as long as they should.

A process is identified by its pid plus its start time in clock ticks (from /proc), so a pid
recorded in a state file is never confused with an unrelated process that reused it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from frontend.workers import die_with_parent

SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")

STRAGGLERS_SECONDS = 5.0
"""How long `ChildProcess.stop` waits at most for the group's members killed last to be gone."""


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A pid together with when it started, which pids alone cannot tell apart."""

    pid: int
    start_ticks: int | None

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        return cls(pid, start_ticks(pid))

    def alive(self) -> bool:
        """True if this very process still runs (zombies count as gone)."""
        stat = _read_stat(self.pid)
        if stat is None or stat[0] == "Z":
            return False
        return self.start_ticks is None or int(stat[19]) == self.start_ticks


def _read_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat from the state field on, or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot, or None if it cannot be read."""
    stat = _read_stat(pid)
    return int(stat[19]) if stat is not None else None


def find_program(name: str, *, sbin: bool = True) -> str | None:
    """Full path of `name` on PATH, also looking in the sbin directories if `sbin` is set."""
    found = shutil.which(name)
    if found is None and sbin:
        found = shutil.which(name, path=os.pathsep.join(SBIN_DIRS))
    return found


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to a process group; False if the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def group_members(pgid: int) -> list[int]:
    """The processes of group `pgid` still running (zombies count as gone), from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _read_stat(int(entry.name))
            if stat is not None and stat[0] != "Z" and int(stat[2]) == pgid:
                members.append(int(entry.name))
    return members


def terminate_group(identity: ProcessIdentity, timeout: float = 30.0) -> None:
    """Stop a process group led by a process we are not the parent of.

    SIGTERM, then SIGKILL if the leader outlives `timeout`. Nothing is sent once the leader is gone:
    its pid, and so the group id, may by then belong to an unrelated process.
    """
    if not identity.alive():
        return
    signal_group(identity.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while identity.alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if identity.alive():
        signal_group(identity.pid, signal.SIGKILL)


class ChildProcess:
    """One child process in its own process group, logging to a file."""

    __slots__ = ("identity", "log_path", "name", "popen")

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self.identity = ProcessIdentity.of(popen.pid)

    @classmethod
    def spawn(
        cls,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ChildProcess:
        """Start `argv` in a new session, stdout and stderr appended to `log_path`."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        return cls(name, popen, log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit code, or None while the process runs."""
        return self.popen.poll()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the group, SIGKILL it after `timeout`, then kill stragglers, wait until they
        are gone (a signal arrives asynchronously: a grandchild was seen still running just after
        its SIGKILL), and reap.

        The leader is waited for without being reaped (WNOWAIT): as a zombie it keeps its pid, so
        the final SIGKILL to the group cannot reach a process that reused the number, and the
        group's members are told apart from any later group of that number.
        """
        if self.popen.returncode is None:
            signal_group(self.pid, signal.SIGTERM)
            if not self._exited_within(timeout):
                signal_group(self.pid, signal.SIGKILL)
                self._exited_within(None)
            signal_group(self.pid, signal.SIGKILL)
            deadline = time.monotonic() + STRAGGLERS_SECONDS
            while group_members(self.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        self.popen.wait()

    def _exited_within(self, timeout: float | None) -> bool:
        """Wait up to `timeout` seconds (None: forever) for the leader to exit, without reaping."""
        flags = os.WEXITED | os.WNOWAIT
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                nohang = 0 if deadline is None else os.WNOHANG
                if os.waitid(os.P_PID, self.pid, flags | nohang) is not None:
                    return True
            except ChildProcessError:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        """The last `lines` lines of the log file."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def describe_exit(self) -> str:
        """A report of an early exit: code, log file and its last lines."""
        tail = self.log_tail()
        report = f"{self.name} exited with code {self.popen.returncode} (log: {self.log_path})"
        return f"{report}; last lines:\n{tail}" if tail else report


class LocalService:
    """A server run as one child process: ``launch`` spawns it (in the subclass), then
    ``_ready_or_stop`` waits for it to answer, stopping it if it never does; ``stop`` ends it.
    Usable as a context manager that starts and stops it."""

    STOP_TIMEOUT = 15.0
    """Seconds between SIGTERM and SIGKILL."""

    child: ChildProcess | None

    def start(self) -> str:
        raise NotImplementedError

    def _ready_or_stop(self, wait: Callable[[], None], address: str) -> str:
        try:
            wait()
        except BaseException:
            self.stop()
            raise
        return address

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(timeout=self.STOP_TIMEOUT)
            self.child = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
