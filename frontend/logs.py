"""Log lines: text or JSON, and repeated warnings and errors summarised.

:func:`setup_logging` gives the root logger one handler on stderr, as ``logging.basicConfig`` does
(and, like it, nothing when the root has a handler already): a text line per record
(:class:`TextFormatter`), or with ``--log-format json`` one JSON object per line
(:class:`JsonFormatter`).

A record is one line, whatever a client put in it: client ids, topics, user names and reasons
reach messages as the client sent them, so the text formatter escapes the control characters of
every message (a newline becomes ``\n``, and so on), once, for every record, not at each call
site; JSON escapes them by itself.  A traceback, which the node writes, keeps its lines.

:class:`RepeatFilter`, on that handler, keeps an outage from writing a line per client.  A record
of WARNING or worse opens a window (10 s) for its logger, level and template (``record.msg``,
before ``%`` formatting) and passes; the same kind again within the window is counted and
dropped.  When the window is over, one line says how many were dropped and what the last said.
INFO and below pass untouched.  The open windows sit in one dict in the order they opened, so the
expired ones are all at its front: every record, of any kind, first closes those (amortised O(1)),
one daemon thread does the same every window for a log gone quiet, and the last ones close at
exit.  Nothing runs per key, and the dict is bounded: when full, the oldest window closes early.
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
WINDOW = 10.0
"""Seconds a kind of warning or error is written once in."""
MAX_WINDOWS = 1024
"""Kinds followed at once; one more closes the oldest window early."""
SUMMARY = "headwater_repeat_summary"
"""The attribute that marks a summary record, which the filter lets through."""

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 and C1 controls, DEL, and the Unicode line and paragraph separators: what can end or
rewrite a line on a terminal or in a log viewer."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(text: str) -> str:
    """``text`` with each control character written as an escape (``\\n``, ``\\x1b``,
    ``\\u2028``); the same string, not a copy, when it has none (the usual case)."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def setup_logging(level: str, form: str) -> None:
    """Log to stderr at ``level``, as ``text`` or ``json`` lines, repeats summarised."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if form == "json" else TextFormatter())
    repeats = RepeatFilter(handler.handle)
    handler.addFilter(repeats)
    logging.basicConfig(level=level, handlers=[handler])
    if handler in logging.getLogger().handlers:
        # what no line of ours shows, not gathered for every record (the logging HOWTO's
        # "Optimization"): the caller's file and line, the thread, the process
        logging._srcfile = None
        logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
        threading.Thread(target=repeats.flush_forever, name="log-repeats", daemon=True).start()
        atexit.register(repeats.flush, everything=True)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, the message one line: its control characters escaped.

    A record without a traceback is written without ``logging.Formatter``'s general path, the
    time's text made once a second: a node writes a line per closed connection, and logging was
    8% of the event loop at 1,500 of them a second (py-spy, ``python -m bench throughput
    --scenarios connect-clean``); a line to a file cost 29 us through the general path and 12
    through this one, the records gathering no caller, thread or process either
    (:func:`setup_logging`).  The line is the general path's, character for character."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._second = -1
        self._stamp = ""
        """``time.strftime`` of ``_second``: the time's text but its milliseconds."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.exc_text or record.stack_info:
            return super().format(record)
        record.message = message = record.getMessage()
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        record.asctime = f"{self._stamp},{int(record.msecs):03d}"  # default_msec_format
        return f"{record.asctime} {record.levelname} {record.name}: {escape_controls(message)}"

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        escaped = escape_controls(message)
        if escaped is message:
            return super().formatMessage(record)
        record.message = escaped  # for this format only: the record is shared by handlers
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601, UTC), level, logger, message, exception."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.fromtimestamp(record.created, UTC)
        line = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line)


@dataclass(slots=True)
class _Window:
    """One kind of record seen lately: since when, and what was dropped since."""

    opened: float
    name: str
    levelno: int
    template: str
    dropped: int = 0
    last: str = ""


class RepeatFilter(logging.Filter):
    """Passes a WARNING-or-worse record once per window per kind; ``emit`` writes the summaries."""

    def __init__(
        self,
        emit: Callable[[logging.LogRecord], object],
        window: float = WINDOW,
        max_windows: int = MAX_WINDOWS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.window = window
        self._emit = emit
        self._max_windows = max_windows
        self._clock = clock
        self._open: dict[tuple[str, int, str], _Window] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and not self._open:
            return True  # the usual case, without the lock: nothing to close, nothing to count
        if getattr(record, SUMMARY, False):
            return True
        closed: list[_Window] = []
        with self._lock:
            now = self._clock()
            self._close_expired(now, closed)
            passed = record.levelno < logging.WARNING or self._admit(record, now, closed)
        self._write(closed)
        return passed

    def flush(self, everything: bool = False) -> None:
        """Close the windows that are over (all of them with ``everything``), with their lines."""
        closed: list[_Window] = []
        with self._lock:
            self._close_expired(float("inf") if everything else self._clock(), closed)
        self._write(closed)

    def flush_forever(self) -> None:
        """Flush once a window, for a log gone quiet (the body of one daemon thread)."""
        while True:
            time.sleep(self.window)
            self.flush()

    def _admit(self, record: logging.LogRecord, now: float, closed: list[_Window]) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        seen = self._open.get(key)
        if seen is not None:
            seen.dropped += 1
            seen.last = _message(record)
            return False
        if len(self._open) >= self._max_windows:
            closed.append(self._open.pop(next(iter(self._open))))
        self._open[key] = _Window(now, record.name, record.levelno, key[2])
        return True

    def _close_expired(self, now: float, closed: list[_Window]) -> None:
        while self._open:
            oldest = next(iter(self._open))
            if now - self._open[oldest].opened < self.window:
                return
            closed.append(self._open.pop(oldest))

    def _write(self, closed: list[_Window]) -> None:
        for window in closed:
            if window.dropped:
                self._emit(self._summary(window))

    def _summary(self, window: _Window) -> logging.LogRecord:
        times = "time" if window.dropped == 1 else "times"
        text = (
            f'"{window.template}" repeated {window.dropped} more {times} '
            f"in the last {self.window:g} s (last: {window.last})"
        )
        record = logging.LogRecord(window.name, window.levelno, "", 0, text, None, None)
        setattr(record, SUMMARY, True)
        return record


def _message(record: logging.LogRecord) -> str:
    """The record's text; its template if its arguments do not fit (never raise while logging)."""
    try:
        return record.getMessage()
    except Exception:
        return str(record.msg)
