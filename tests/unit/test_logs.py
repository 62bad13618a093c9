"""Log lines (``frontend.logs``): JSON fields, and repeats summarised once a window."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime

from frontend.logs import (
    TEXT_FORMAT,
    JsonFormatter,
    RepeatFilter,
    TextFormatter,
    escape_controls,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Lines:
    """A handler's output, through a RepeatFilter on a fake clock."""

    def __init__(self, window: float = 10.0, max_windows: int = 1024) -> None:
        self.clock = Clock()
        self.written: list[logging.LogRecord] = []
        self.filter = RepeatFilter(self.handle, window, max_windows, self.clock)

    def handle(self, record: logging.LogRecord) -> None:
        if self.filter.filter(record):
            self.written.append(record)

    def log(self, level: int, msg: str, *args: object, name: str = "headwater.node") -> None:
        self.handle(logging.LogRecord(name, level, __file__, 1, msg, args, None))

    @property
    def text(self) -> list[str]:
        return [record.getMessage() for record in self.written]


# -- JSON ------------------------------------------------------------------------------------------


def test_a_json_line_has_the_fields() -> None:
    record = logging.LogRecord(
        "headwater.node", logging.ERROR, __file__, 1, "client %s", ("c1",), None
    )
    record.created = 0.25
    line = json.loads(JsonFormatter().format(record))
    assert line == {
        "time": "1970-01-01T00:00:00.250Z",
        "level": "ERROR",
        "logger": "headwater.node",
        "message": "client c1",
    }
    assert datetime.fromisoformat(line["time"]).utcoffset() is not None


def test_a_json_line_carries_the_exception_on_one_line() -> None:
    try:
        raise ConnectionError("Redis unavailable")
    except ConnectionError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "lost", None, exc_info)
    text = JsonFormatter().format(record)
    assert "\n" not in text
    exception = json.loads(text)["exception"]
    assert exception.startswith("Traceback") and "ConnectionError: Redis unavailable" in exception


# -- repeats ---------------------------------------------------------------------------------------

TEMPLATE = "client %s: session not saved: Redis unavailable"


def test_a_burst_is_one_line_and_one_summary() -> None:
    lines = Lines()
    for n in range(1000):
        lines.log(logging.ERROR, TEMPLATE, f"c{n}")
        lines.clock.now += 0.005
    assert lines.text == ["client c0: session not saved: Redis unavailable"]
    lines.clock.now += 10
    lines.log(logging.INFO, "Redis is back")
    assert lines.text[1:] == [
        f'"{TEMPLATE}" repeated 999 more times in the last 10 s '
        "(last: client c999: session not saved: Redis unavailable)",
        "Redis is back",
    ]
    assert lines.written[1].levelno == logging.ERROR
    assert lines.written[1].name == "headwater.node"


def test_the_next_window_starts_with_a_line() -> None:
    lines = Lines()
    for _ in range(3):
        lines.log(logging.WARNING, "slow %s", "x")
    lines.clock.now += 11
    lines.log(logging.WARNING, "slow %s", "y")
    assert lines.text == [
        "slow x",
        '"slow %s" repeated 2 more times in the last 10 s (last: slow x)',
        "slow y",
    ]


def test_a_quiet_log_is_flushed() -> None:
    lines = Lines()
    lines.log(logging.ERROR, "down")
    lines.log(logging.ERROR, "down")
    lines.filter.flush()
    assert lines.text == ["down"]  # the window is not over
    lines.clock.now += 10
    lines.filter.flush()
    assert lines.text == ["down", '"down" repeated 1 more time in the last 10 s (last: down)']


def test_everything_is_flushed_at_exit() -> None:
    lines = Lines()
    for _ in range(4):
        lines.log(logging.ERROR, "down")
    lines.filter.flush(everything=True)
    assert lines.text[1] == '"down" repeated 3 more times in the last 10 s (last: down)'


def test_a_single_line_has_no_summary() -> None:
    lines = Lines()
    lines.log(logging.ERROR, "once")
    lines.clock.now += 20
    lines.filter.flush()
    assert lines.text == ["once"]


def test_different_templates_loggers_and_levels_are_not_merged() -> None:
    lines = Lines()
    lines.log(logging.ERROR, "Kafka %s", "down")
    lines.log(logging.ERROR, "Redis %s", "down")
    lines.log(logging.ERROR, "Kafka %s", "down", name="headwater.log")
    lines.log(logging.WARNING, "Kafka %s", "down")
    assert lines.text == ["Kafka down", "Redis down", "Kafka down", "Kafka down"]


def test_info_and_below_are_untouched() -> None:
    lines = Lines()
    for n in range(100):
        lines.log(logging.INFO, "client %s connected", n)
        lines.log(logging.DEBUG, "client %s connected", n)
    assert len(lines.text) == 200
    lines.filter.flush(everything=True)
    assert len(lines.text) == 200


def test_the_windows_are_bounded() -> None:
    lines = Lines(max_windows=2)
    for template in ("a", "a", "b", "c"):  # c closes a's window early
        lines.log(logging.ERROR, template)
    assert lines.text == ["a", "b", '"a" repeated 1 more time in the last 10 s (last: a)', "c"]
    assert len(lines.filter._open) == 2


def test_arguments_that_do_not_fit_never_raise() -> None:
    lines = Lines()
    lines.log(logging.ERROR, "client %s %s", "only-one")
    lines.log(logging.ERROR, "client %s %s", "only-one")
    lines.filter.flush(everything=True)
    assert lines.written[-1].getMessage().endswith("(last: client %s %s)")


# -- one record, one line ---------------------------------------------------------------------


def forged(client_id: str) -> logging.LogRecord:
    return logging.LogRecord(
        "headwater.connection", logging.INFO, __file__, 1, "client %s closed: %s",
        (client_id, "[MQTT-3.1.0-1] the first packet must be CONNECT"), None,
    )  # fmt: skip


FORGERY = "a\n2030-01-01 00:00:00,000 WARNING headwater.node: node draining\r\x1b[2J\u2028\x85"


def test_control_characters_in_a_text_line_are_escaped() -> None:
    line = TextFormatter().format(forged(FORGERY))
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "\u2028" not in line and "\x85" not in line
    assert "client a\\n2030-01-01 00:00:00,000 WARNING" in line
    assert line.endswith(
        "\\r\\x1b[2J\\u2028\\x85 closed: [MQTT-3.1.0-1] the first packet must be CONNECT"
    )


def test_a_text_line_is_what_logging_writes_with_the_format() -> None:
    general, ours = logging.Formatter(TEXT_FORMAT), TextFormatter()
    for created in (1795838297.064, 1795838297.999, 1795838298.0, 1795838297.5):
        record = forged("dev-1")
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert ours.format(record) == general.format(record)


def test_escaping_leaves_the_record_and_tracebacks_alone() -> None:
    record = forged(FORGERY)
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    text = TextFormatter().format(record)
    assert "\nTraceback (most recent call last):\n" in text  # the node's own lines
    assert text.split("\n")[0].endswith("the first packet must be CONNECT")
    assert record.message == record.getMessage()  # other handlers see what was logged
    assert escape_controls("plain text") == "plain text"


def test_a_json_line_stays_one_valid_object() -> None:
    line = JsonFormatter().format(forged(FORGERY))
    assert "\n" not in line and "\u2028" not in line
    assert json.loads(line)["message"].startswith(f"client {FORGERY} closed")
