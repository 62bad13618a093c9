"""The sans-IO core does no I/O: no event loop, no sockets, no Kafka, no Redis.

Checked on the source (``ast``), without importing anything, for every module of the pure
packages, found by globbing so a new module is covered the day it is added.  The check follows
imports inside the project: a pure module that imports ``frontend.broker`` (which uses asyncio)
fails here even though it never names asyncio itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = sorted(
    [
        *ROOT.glob("frontend/mqtt/*.py"),
        ROOT / "frontend" / "session.py",
        ROOT / "frontend" / "trie.py",
        *ROOT.glob("router/*.py"),
    ]
)
FORBIDDEN = {"asyncio", "confluent_kafka", "redis", "socket"}
PROJECT = {"frontend", "router", "headwater", "spark_streaming"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _path_of(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports, wherever in the file."""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            # ``from frontend.mqtt import topics`` imports the submodule frontend.mqtt.topics
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _reachable(path: Path) -> dict[str, str]:
    """Every module imported from ``path``, following project modules: name -> importer."""
    seen: dict[str, str] = {}
    todo = [path]
    visited: set[Path] = set()
    while todo:
        current = todo.pop()
        if current in visited:
            continue
        visited.add(current)
        for name in _imports(current):
            seen.setdefault(name, _module_name(current))
            if name.split(".")[0] in PROJECT:
                target = _path_of(name)
                if target is not None:
                    todo.append(target)
    return seen


def test_the_pure_packages_are_found() -> None:
    names = {_module_name(path) for path in PURE}
    assert {"frontend.mqtt.channel", "frontend.mqtt.codec", "frontend.session"} <= names
    assert {"frontend.trie", "router.partitioner", "router.interest"} <= names


def test_imports_are_resolved() -> None:
    reachable = _reachable(ROOT / "frontend" / "mqtt" / "channel.py")
    assert "frontend.mqtt.errors" in reachable  # relative import in codec, via channel
    assert "frontend.record" in reachable
    assert "fastavro" in reachable  # through frontend.record


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_no_io(path: Path) -> None:
    bad = {
        f"{name} (imported by {importer})"
        for name, importer in _reachable(path).items()
        if name.split(".")[0] in FORBIDDEN
    }
    assert not bad
