"""The one writer of ``docs/benchmarks.md``: each subcommand owns the section between its markers.

A section is ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``; writing one replaces only what
lies between its own markers, so each subcommand can be rerun alone.  A section not in the file
yet goes after the main results' ``## Details`` section (before the next heading or marker
after it) when there is one, else at the end.  The helpers here format what every section shows.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import confluent_kafka

DEFAULT_OUTPUT = Path("docs/benchmarks.md")


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_section(path: Path, section: str, marks: tuple[str, str] | None = None) -> None:
    """Put ``section`` (which starts with its begin marker) in place of its old self."""
    begin, end = marks or (section.split("\n", 1)[0], section.rstrip("\n").rsplit("\n", 1)[-1])
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section.rstrip("\n") + rest.split(end, 1)[1]
    else:
        lines = text.splitlines(keepends=True)
        heads = [k for k, line in enumerate(lines) if line.startswith(("## ", "# ", "<!--"))]
        details = [k for k in heads if lines[k].strip() == "## Details"]
        after = next((k for k in heads if details and k > details[0]), None)
        if after is not None and ":end -->" in lines[after]:
            after += 1  # not inside the section that holds the Details
        if after is None:
            text = text.rstrip("\n") + "\n\n" + section
        else:
            head = "".join(lines[:after]).rstrip("\n") + "\n\n"
            text = head + section.rstrip("\n") + "\n\n" + "".join(lines[after:])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def wrap(name: str, lines: list[str]) -> str:
    begin, end = markers(name)
    return "\n".join([begin, *lines, end, ""])


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: the header, its rule, one line per row."""
    lines = [f"| {' | '.join(line)} |" for line in [head, *rows]]
    return [lines[0], "|" + "---|" * len(head), *lines[1:]]


def versions() -> dict[str, str]:
    found = {
        "confluent-kafka": metadata.version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
    }
    try:
        found["uvloop"] = metadata.version("uvloop")
    except metadata.PackageNotFoundError:
        found["uvloop"] = "not installed"
    return found


def error_summary(error: str) -> str:
    """A failure on one line: its first line and, for a traceback, its last (the exception)."""
    lines = [line.strip() for line in error.strip().splitlines() if line.strip()]
    if not lines:
        return "?"
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def fmt_pct(value: float) -> str:
    return f"{value * 100:.1f}%" if value >= 0.0005 or value == 0 else f"{value * 100:.2f}%"


def first_line(error: str, width: int = 80) -> str:
    return error.splitlines()[0][:width] if error else "?"
