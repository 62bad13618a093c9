"""``headwater stats``: each front-end's view of itself, one line per node.

Reads ``GET /stats`` from every node of a running ``dev up`` (their addresses are in its state
file) or from URLs given on the command line, and prints what tells whether interest routing is
doing its job: the partitions a node reads, what it fetched, what it delivered, and its lag.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from headwater.devcluster.state import read_state
from headwater.errors import HeadwaterError

COLUMNS = (
    ("node", "node_id"),
    ("clients", "clients"),
    ("partitions", "assigned_partitions"),
    ("fetched", "records_fetched"),
    ("fetched bytes", "bytes_fetched"),
    ("delivered", "messages_delivered"),
    ("dropped", "messages_dropped"),
    ("lag", "consumer_lag"),
)


def stats_urls(state_dir: Path) -> list[str]:
    state = read_state(state_dir)
    if state is None:
        raise HeadwaterError(f"no running dev cluster in {state_dir} (start one: make run)")
    return [url for name, url in state.endpoints.items() if name.endswith(" stats")]


def fetch(url: str, timeout: float = 5.0) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            answer: dict[str, Any] = json.load(response)
            return answer
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HeadwaterError(f"{url}: {exc}") from exc


def cell(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    if isinstance(value, dict):
        return str(sum(value.values()))
    return str(value)


def print_table(snapshots: list[dict[str, Any]], out: TextIO) -> None:
    rows = [[title for title, _ in COLUMNS]]
    rows += [[cell(snap.get(key, "?")) for _, key in COLUMNS] for snap in snapshots]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print(
            "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)), file=out
        )
