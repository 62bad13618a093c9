"""The shape of the code (docs ../shared/ARCHITECTURE.md): layers, a pure core, module sizes.

Checked on the source with ``ast``, never by importing it, over every module of the first-party
packages found by globbing, so a module added tomorrow is checked the day it appears.

An import is the absolute dotted name a statement brings in, wherever the statement is: at the
top, inside a function, under ``if TYPE_CHECKING:``.  Relative imports are resolved, and
``from pkg import name`` imports ``pkg.name`` when that is a module, else ``pkg``.

The import graph has an edge from a module to every module whose code an import of it runs: the
module named, and each package ``__init__`` above it (``import a.b.c`` runs ``a`` and ``a.b``
first), except the importer's own packages, which are already running when it runs.  An
``__init__`` without imports has no edges of its own, so it can end no cycle.
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("schemas", "mqttcore", "router", "frontend", "spark_streaming", "headwater")
"""The packages bottom to top (``../shared/ARCHITECTURE.md``): each imports only those below it.
``schemas`` holds the log's Avro files; ``mqttcore`` is the pure protocol; ``router`` the log and
who gets a record; ``frontend`` the MQTT side of a node; ``spark_streaming`` the analytics on the
log; ``headwater`` the CLI and dev tooling, which nothing imports."""
FIRST_PARTY = LAYERS
PRODUCT = LAYERS[:-1]  # headwater is the CLI/tooling

CORE = "mqttcore"
CORE_FORBIDDEN = ("asyncio", "socket", "confluent_kafka", "redis", "time", "os", "random", "uuid")
SPARK_MAY_IMPORT = (
    "router.record",
    "router.partitioner",
    "router.topics",
    "mqttcore.message",
    "schemas",
)
MAX_MODULE_LINES = 700

Graph = dict[str, dict[str, int]]
"""importer -> {imported module: line of the first import statement that runs it}"""


@dataclass(frozen=True, slots=True)
class Import:
    importer: str
    name: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.name}"


# -- reading the source -------------------------------------------------------------------------


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def discover(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``: dotted name -> file."""
    found = (path for package in packages for path in sorted((root / package).rglob("*.py")))
    return {module_name(root, path): path for path in found}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def ancestors(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages an import of ``name`` runs first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _base(node: ast.ImportFrom, package: list[str]) -> str:
    """The absolute module of ``from <...> import``, relative levels resolved."""
    base = package[: len(package) - node.level + 1] if node.level else []
    return ".".join([*base, *([node.module] if node.module else [])])


def _from_import(base: str, name: str, known: Collection[str]) -> str:
    return f"{base}.{name}" if f"{base}.{name}" in known else base


def imports_of(module: str, path: Path, known: Collection[str]) -> list[Import]:
    """Every import in ``path``; ``known`` (modules and packages) tells submodules apart."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(node, package)
            names = {_from_import(base, alias.name, known) for alias in node.names}
            found += [Import(module, name, node.lineno) for name in sorted(names)]
    return found


def all_imports(modules: Mapping[str, Path]) -> list[Import]:
    known = {*modules, *(a for name in modules for a in ancestors(name))}
    return [imp for name, path in modules.items() for imp in imports_of(name, path, known)]


def import_graph(modules: Collection[str], imports: Iterable[Import]) -> Graph:
    graph: Graph = {name: {} for name in modules}
    for imp in imports:
        running = {*ancestors(imp.importer), imp.importer}
        for target in [*ancestors(imp.name), imp.name]:
            if target in modules and target not in running:
                graph[imp.importer].setdefault(target, imp.line)
    return graph


# -- cycles -------------------------------------------------------------------------------------


def components(graph: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node: where the cycles are."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycle_in(component: list[str], graph: Mapping[str, Collection[str]]) -> list[str]:
    """A shortest cycle through the component's first module, found breadth first: [a, b, a]."""
    start = component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier and start not in came_from:
        following: list[str] = []
        for node in frontier:
            for target in sorted(set(graph[node]) & set(component) - set(came_from)):
                came_from[target] = node
                following.append(target)
        frontier = following
    path = [start]
    while len(path) == 1 or path[-1] != start:
        path.append(came_from[path[-1]])
    return path[::-1]


def describe(cycle: list[str], graph: Graph) -> str:
    steps = [f"{a}:{graph[a][b]}" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def report(component: list[str], graph: Graph) -> str:
    """One cycle of the component, and the component's other modules (in other cycles)."""
    cycle = cycle_in(component, graph)
    others = sorted(set(component) - set(cycle))
    return describe(cycle, graph) + (f"\n  and in cycles with it: {others}" if others else "")


# -- the project's modules ----------------------------------------------------------------------


@functools.cache
def modules() -> dict[str, Path]:
    return discover(ROOT, FIRST_PARTY)


@functools.cache
def imports() -> tuple[Import, ...]:
    return tuple(all_imports(modules()))


def violations(importer: Callable[[str], bool], bad: Callable[[str], bool]) -> list[str]:
    return [str(imp) for imp in imports() if importer(imp.importer) and bad(imp.name)]


def first_party(name: str) -> bool:
    return name.split(".")[0] in FIRST_PARTY


def test_every_package_is_found() -> None:
    tops = {name.split(".")[0] for name in modules()}
    assert tops == set(FIRST_PARTY)
    assert {"mqttcore.channel", "router.record", "spark_streaming.jobs"} <= set(modules())


def test_no_import_cycle() -> None:
    graph = import_graph(modules(), imports())
    cycles = [report(component, graph) for component in components(graph)]
    assert not cycles, "import cycles (module:line -> ...):\n" + "\n".join(cycles)


def test_mqtt_core_is_pure() -> None:
    # The core's modules, and the package above it, which runs whenever the core is imported.
    def in_core(module: str) -> bool:
        return within(module, CORE) or module in ancestors(CORE)

    def outside(name: str) -> bool:
        io = name.split(".")[0] in CORE_FORBIDDEN
        return io or (first_party(name) and not within(name, CORE))

    bad = violations(in_core, outside)
    assert not bad, f"{CORE} must import only itself and no I/O:\n" + "\n".join(bad)


def test_product_does_not_import_the_tooling() -> None:
    bad = violations(lambda m: m.split(".")[0] in PRODUCT, lambda n: within(n, "headwater"))
    assert not bad, "the product must not import headwater (CLI, dev tooling):\n" + "\n".join(bad)


def upward(found: Iterable[Import]) -> list[str]:
    """The imports of ``found`` that run up :data:`LAYERS`."""

    def layer(name: str) -> int:
        return LAYERS.index(name.split(".")[0])

    return [str(i) for i in found if first_party(i.name) and layer(i.name) > layer(i.importer)]


def test_packages_import_only_the_layers_below() -> None:
    bad = upward(imports())
    order = " < ".join(LAYERS)
    assert not bad, f"an import runs up the layers ({order}):\n" + "\n".join(bad)


def test_the_layer_check_sees_an_arrow_back_up() -> None:
    down, up = Import("router.log", "mqttcore.codec", 3), Import("mqttcore.channel", "router", 9)
    assert upward([down, up]) == ["mqttcore.channel:9 imports router"]


def test_spark_streaming_imports_only_the_record_format() -> None:
    def forbidden(name: str) -> bool:
        allowed = any(within(name, ok) for ok in ("spark_streaming", *SPARK_MAY_IMPORT))
        return first_party(name) and not allowed

    bad = violations(lambda m: within(m, "spark_streaming"), forbidden)
    allowed = ", ".join(SPARK_MAY_IMPORT)
    assert not bad, f"spark_streaming may import only {allowed}:\n" + "\n".join(bad)


def test_modules_are_short() -> None:
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    bad = [f"{name}: {n} lines" for name, n in lengths.items() if n > MAX_MODULE_LINES]
    assert not bad, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(bad)


SESSIONS = "frontend.sessions"
SESSION_LIFE_CALLS = ("takeover", "lose_session", "take_over", "keep_will")
"""Steps of a session's life: closing the connection serving it, keeping its will."""
STORE_LIFE_CALLS = ("acquire", "release")
"""The session store's own steps (a call on something named ``...store``)."""


def session_life_calls(module: str, path: Path) -> list[str]:
    """Where ``module`` takes a step of a session's life (``SESSION_LIFE_CALLS``, or the
    store's ``acquire``/``release``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, owner = node.func.attr, ast.unparse(node.func.value)
        if name in SESSION_LIFE_CALLS or (
            name in STORE_LIFE_CALLS and owner.lower().endswith("store")
        ):
            found.append(f"{module}:{node.lineno} calls {owner}.{name}")
    return found


def test_a_sessions_life_is_decided_in_frontend_sessions_only() -> None:
    # One owner of a session's life (../shared/ARCHITECTURE.md): acquire and release in the
    # store, the will kept, a connection closed for a takeover: none of it elsewhere.
    bad = [
        call
        for module, path in modules().items()
        if not within(module, SESSIONS)
        for call in session_life_calls(module, path)
    ]
    assert not bad, "session life outside frontend.sessions:\n" + "\n".join(bad)


def test_the_session_life_check_sees_a_call_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("def f(d, s):\n    d.take_over('c')\n    s.store.acquire('c')\n")
    assert session_life_calls("m", path) == ["m:2 calls d.take_over", "m:3 calls s.store.acquire"]


BACK_REFERENCES_LEFT = {
    ("frontend.auth", "Access"): "asks its Auth for the rules of now (a SIGHUP reload)",
    ("frontend.systree", "WithTotals"): "asks its SysTree for the $SYS totals",
}
"""Helpers still made with a reference to their maker (not in issue 21 item 3's files)."""


def back_references(module: str, path: Path) -> list[tuple[str, str, int]]:
    """Where ``module`` makes an object of a class, handing it ``self``: a helper that keeps a
    reference back to its owner (``../shared/STYLE.md``: worse than the longer class)."""
    found: list[tuple[str, str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        values = [*node.args, *(keyword.value for keyword in node.keywords)]
        handed_self = any(isinstance(v, ast.Name) and v.id == "self" for v in values)
        if handed_self and node.func.id[:1].isupper():
            found.append((module, node.func.id, node.lineno))
    return found


def test_no_helper_is_handed_its_owner() -> None:
    bad = [
        f"{maker}:{line} makes {name}(self, ...)"
        for module, path in modules().items()
        for maker, name, line in back_references(module, path)
        if (maker, name) not in BACK_REFERENCES_LEFT
    ]
    assert not bad, "helpers holding a reference back to their owner:\n" + "\n".join(bad)


def test_the_back_reference_check_sees_one(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("class A:\n    def f(self):\n        self.p = P(self, 1)\n        g(self)\n")
    assert back_references("m", path) == [("m", "P", 3)]


# -- the checker itself, on a made-up tree ------------------------------------------------------

FAKE_TREE = {
    "a/__init__.py": "from a.b import c\n",
    "a/b/__init__.py": "",
    "a/b/c.py": "from . import d\n",
    "a/b/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..e import X\n",
    "a/e.py": "def f() -> None:\n    import z.y\n",
    "z/__init__.py": "import a.b.c\n",
    "z/y.py": "import os.path\n",
}


def _fake_graph(root: Path) -> Graph:
    for relative, text in FAKE_TREE.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    found = discover(root, ["a", "z"])
    return import_graph(found, all_imports(found))


def test_checker_resolves_imports(tmp_path: Path) -> None:
    graph = _fake_graph(tmp_path)
    assert graph["a"] == {"a.b": 1, "a.b.c": 1}  # from-import of a submodule, with its package
    assert graph["a.b.c"] == {"a.b.d": 1}  # relative; a and a.b already run: no edge
    assert graph["a.b.d"] == {"a.e": 3}  # under TYPE_CHECKING, two levels up
    assert graph["a.e"] == {"z": 2, "z.y": 2}  # inside a function; z/__init__ runs first
    assert graph["z"] == {"a": 1, "a.b": 1, "a.b.c": 1}
    assert graph["z.y"] == {}  # not first-party


def test_checker_reports_a_cycle(tmp_path: Path) -> None:
    graph = _fake_graph(tmp_path)
    found = components(graph)
    assert found == [["a", "a.b.c", "a.b.d", "a.e", "z"]]  # a.b and z.y import nothing back
    cycle = describe(cycle_in(found[0], graph), graph)
    assert cycle == "a:1 -> a.b.c:1 -> a.b.d:3 -> a.e:2 -> z:1 -> a"


# -- bench/: a load generator from outside ------------------------------------------------------

BENCH_MAY_NOT_IMPORT = ("frontend", "router", "mqttcore", "headwater")
"""The product and its tooling: bench/ starts Headwater by shelling out to ``headwater dev up``
and speaks MQTT with a codec of its own, so a bug in the product cannot hide one in the load."""
BENCH_SPARK = "bench.spark_job"
"""The one module that may import ``spark_streaming``: it runs the analytics job it measures."""


def bench_imports(root: Path = ROOT) -> list[Import]:
    return all_imports(discover(root, ["bench"]))


def product_imports_of_bench(found: Iterable[Import]) -> list[str]:
    def bad(imp: Import) -> bool:
        top = imp.name.split(".")[0]
        spark = top == "spark_streaming" and imp.importer != BENCH_SPARK
        return top in BENCH_MAY_NOT_IMPORT or top == "schemas" or spark

    return [str(imp) for imp in found if bad(imp)]


def test_bench_imports_nothing_of_the_product() -> None:
    found = bench_imports()
    assert {imp.importer for imp in found} >= {"bench.load", "bench.mqtt", "bench.brokers"}
    bad = product_imports_of_bench(found)
    assert not bad, "bench/ must not import the product (shell out instead):\n" + "\n".join(bad)


def test_the_bench_check_sees_a_product_import() -> None:
    found = [
        Import("bench.load", "mqttcore.codec", 3),
        Import("bench.brokers", "headwater.services.kafka", 7),
        Import("bench.spark_job", "spark_streaming.runner", 9),
        Import("bench.scale", "spark_streaming", 2),
        Import("bench.load", "asyncio", 1),
    ]
    assert product_imports_of_bench(found) == [
        "bench.load:3 imports mqttcore.codec",
        "bench.brokers:7 imports headwater.services.kafka",
        "bench.scale:2 imports spark_streaming",
    ]
