"""Shrink a crashing input: ``python -m tests.fuzz.minimize CRASH_FILE [OUT_FILE]``.

libFuzzer's ``-minimize_crash`` re-executes the script as a program, which a Python script run by
an interpreter is not; this does the same in process.  A crash is identified by its exception
type and the line that raised it, and the input is shrunk while that identity holds: whole packets
are deleted, the options are cleared bit by bit, chunk sizes dropped, then ever smaller runs of
bytes deleted.  Prints the shrunk input as a Python literal (to pin it in
``tests/unit/test_fuzz.py``) and its traceback.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

from mqttcore.codec import Decoder
from mqttcore.errors import ProtocolError

from .harness import Plan, make_input, run

Crash = tuple[str, str, int]


def crash_of(data: bytes) -> Crash | None:
    """The exception type and the file and line that raised it, or None if ``data`` passes."""
    try:
        run(data)
    except Exception as error:
        frame = traceback.extract_tb(error.__traceback__)[-1]
        return type(error).__name__, frame.filename, frame.lineno or 0
    return None


def minimize(data: bytes) -> bytes:
    crash = crash_of(data)
    if crash is None:
        raise ValueError("the input does not crash")
    data = _drop_packets(data, crash)
    data = _simplify_plan(data, crash)
    return _drop_bytes(data, crash)


def packet_spans(data: bytes) -> list[tuple[int, int]]:
    """Where each complete packet of the input's stream lies in ``data``, in order."""
    plan = Plan.parse(data)
    offset = len(data) - len(plan.stream)
    decoder = Decoder(plan.max_packet_size)
    spans: list[tuple[int, int]] = []
    start = 0
    for i in range(len(plan.stream)):
        try:
            if decoder.feed(plan.stream[i : i + 1]):
                spans.append((offset + start, offset + i + 1))
                start = i + 1
        except ProtocolError:
            break
    return spans


def _drop_packets(data: bytes, crash: Crash) -> bytes:
    spans = packet_spans(data)
    i = len(spans) - 1
    while i >= 0:
        start, stop = spans[i]
        candidate = data[:start] + data[stop:]
        if crash_of(candidate) == crash:
            data, spans = candidate, packet_spans(candidate)
        i = min(i - 1, len(spans) - 1)
    return data


def _simplify_plan(data: bytes, crash: Crash) -> bytes:
    plan = Plan.parse(data)
    options, control, sizes = plan.options, plan.control & 0xF0, list(plan.chunk_sizes)
    for bit in range(8):
        if crash_of(make_input(plan.stream, options & ~(1 << bit), tuple(sizes), control)) == crash:
            options &= ~(1 << bit)
        if crash_of(make_input(plan.stream, options, tuple(sizes), control & ~(1 << bit))) == crash:
            control &= ~(1 << bit)
    for i in reversed(range(len(sizes))):
        fewer = sizes[:i] + sizes[i + 1 :]
        if crash_of(make_input(plan.stream, options, tuple(fewer), control)) == crash:
            sizes = fewer
    return make_input(plan.stream, options, tuple(sizes), control)


def _drop_bytes(data: bytes, crash: Crash) -> bytes:
    size = max(len(data) // 2, 1)
    while size:
        i = 0
        while i < len(data):
            candidate = data[:i] + data[i + size :]
            if crash_of(candidate) == crash:
                data = candidate
            else:
                i += size
        size //= 2
    return data


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3):
        sys.exit("usage: python -m tests.fuzz.minimize CRASH_FILE [OUT_FILE]")
    small = minimize(Path(argv[1]).read_bytes())
    if len(argv) == 3:
        Path(argv[2]).write_bytes(small)
    print(repr(small))
    try:
        run(small)
    except Exception:
        traceback.print_exc()


if __name__ == "__main__":
    main(sys.argv)
