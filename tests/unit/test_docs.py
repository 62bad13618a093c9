"""The documents say what the code does: every name they cite exists, every figure design.md
takes from a benchmark is in docs/benchmarks.md, every Redis key and `$SYS` topic is one the
code uses.

Checked on the text and on the source with ``ast``, never by importing it (no Spark, no Kafka
client needed). The documents are README.md and docs/*.md except docs/benchmarks.md, which
`make bench` writes. What is checked, in backquotes (`` `...` ``):

* a dotted Python name (``router.record.HEADER``, ``Dispatcher.dispatch``,
  ``outages.catch_up_failed``, ``mqtt/codec.Decoder``): its module is found (the longest dotted
  prefix that is a first-party module, or a module whose last name is the first word), then each
  following name is defined there (a class, function, assignment or import at module level; a
  method, class attribute or ``self.x`` attribute inside a class). A capitalised first word is a
  class, looked up in every module. Words that are not first-party modules (``spark.jars.ivy``,
  ``cleanup.policy``) are configuration keys, not Python, and are left alone;
* a test, ``e2e/test_cluster::test_idle_node_fetches_nothing`` (``tests/`` and ``.py`` left out
  as design.md writes them), or a bare ``test_name`` continuing such a list: it is defined;
* a source path ending in ``.py``, ``.avsc``, ``.toml``, ``.yml``, ``.json`` or ``.xml``: the file
  exists (written from the root, or as the tail of a path, as design.md's tables do);
* an UPPER_CASE name (``FORCE_AFTER``, ``HEADWATER_PORT``) and, in design.md, a snake_case name
  (``claim_wills``): it is a word of the code or its configuration;
* a Redis key ``hw:...``: it has the shape of a key the stores document (``P{cid}:session`` in
  ``frontend/sessions/redis.py``), the same literal parts, a hash tag where the code has one;
* a ``$SYS/...`` topic: under a prefix ``frontend/systree.py`` publishes.

Benchmark figures (design.md). A sentence of design.md *cites the benchmarks* when it names
``docs/benchmarks.md`` or a benchmark command (``make bench``, ``make profile``, ``python -m
bench``, ``bench.<scenario>``). Each number in such a sentence that carries a unit of time, size,
rate, share or ratio (``ms``, ``s``, ``KiB``, ``msg/s``, ``a second``, ``%``, ``x``) must be a
figure of docs/benchmarks.md: some number there, rounded to the digits written, equals it. (A
loose test for one-decimal figures, which many numbers round to; a tight one for the rest.)
Settings and test results are stated in sentences that do not cite the benchmarks. A commit or a
run time (``2026-11-23 21:19 UTC``) design.md names must be one benchmarks.md names.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md"),
]
DESIGN = ROOT / "docs" / "design.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
SOURCE_SUFFIXES = (".py", ".avsc", ".toml", ".yml", ".json", ".xml")
CONFIG_FILES = ("Makefile", "pyproject.toml", "docker", "kafka")

# Names in backquotes that are not this project's code: other brokers' settings, Kafka's and
# Spark's, fields of the Avro schema, columns of the Spark jobs.
FOREIGN_WORDS = {
    "acl_file",
    "password_file",
    "use_identity_as_username",
    "allow_anonymous",
    "max_packet_size",
    "max_connections",
    "flapping_detect",
    "max_retained_messages",
    "node_address",
    "mqtt_messages",
    "mqtt_sessions",
    "mqtt_retained_messages",
    "mqtt_connections",
    "sys_tree",
    "handle_frame_error",
    "t_parse_cont",
    "total_commands_processed",
    "used_memory",
    "TYPE_CHECKING",
}

BACKQUOTED = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def prose(text: str) -> str:
    """A document without its fenced blocks (commands and transcripts are checked elsewhere)."""
    return FENCE.sub("", text)


def backquoted(path: Path) -> list[str]:
    return BACKQUOTED.findall(prose(path.read_text()))


# --- the source, read once -------------------------------------------------------------------


@dataclass
class Module:
    name: str
    path: Path
    names: set[str] = field(default_factory=set)
    classes: dict[str, set[str]] = field(default_factory=dict)
    bases: dict[str, list[str]] = field(default_factory=dict)


def _class_members(node: ast.ClassDef) -> set[str]:
    members: set[str] = set()
    for item in ast.walk(node):
        if (
            isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and item is not node
        ):
            members.add(item.name)
        elif isinstance(item, ast.Assign):
            members.update(_targets(item.targets))
        elif isinstance(item, ast.AnnAssign):
            members.update(_targets([item.target]))
    return members


def _targets(targets: list[ast.expr]) -> Iterator[str]:
    for target in targets:
        if isinstance(target, ast.Name):
            yield target.id
        elif isinstance(target, ast.Attribute):
            yield target.attr
        elif isinstance(target, ast.Tuple):
            yield from _targets(list(target.elts))


def _read_module(name: str, path: Path) -> Module:
    module = Module(name, path)
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            module.names.add(node.name)
            module.classes[node.name] = _class_members(node)
            module.bases[node.name] = [ast.unparse(b).split(".")[-1] for b in node.bases]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            module.names.add(node.name)
        elif isinstance(node, ast.Assign):
            module.names.update(_targets(node.targets))
        elif isinstance(node, ast.AnnAssign):
            module.names.update(_targets([node.target]))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            module.names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    module.names.update((a.asname or a.name).split(".")[0] for a in inner.names)
    return module


def _first_party() -> list[str]:
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")


@functools.cache
def modules() -> dict[str, Module]:
    found: dict[str, Module] = {}
    for package in [*_first_party(), "tests"]:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ".venv" in path.parts or "node_modules" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = _read_module(".".join(parts), path)
    for name in list(found):  # a package's submodules are names of it
        parent, _, child = name.rpartition(".")
        if parent in found:
            found[parent].names.add(child)
    return found


def product_modules() -> list[Module]:
    """The code the documents describe: every first-party module but the tests."""
    return [m for name, m in modules().items() if not name.startswith("tests")]


@functools.cache
def code_words() -> frozenset[str]:
    """Every identifier-like word of the code and its configuration (not of the documents)."""
    words: set[str] = set()
    paths = [m.path for m in product_modules()]
    for name in CONFIG_FILES:
        target = ROOT / name
        paths += [p for p in target.rglob("*") if p.is_file()] if target.is_dir() else [target]
    paths += list((ROOT / "schemas").glob("*.avsc"))
    for path in paths:
        if (
            path.suffix
            in ("", ".py", ".toml", ".yml", ".yaml", ".avsc", ".cfg", ".xml", ".example", ".json")
            or path.name == "Dockerfile"
        ):
            try:
                words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text()))
            except (UnicodeDecodeError, OSError):
                continue
    return frozenset(words)


@functools.cache
def code_text() -> str:
    return "\n".join(m.path.read_text() for m in product_modules())


def _derived_variable(name: str) -> bool:
    """``HEADWATER_MAX_QUEUED``: a variable the settings table derives from ``--max-queued``."""
    flag = name.removeprefix("HEADWATER_").lower().replace("_", "-")
    return name.startswith("HEADWATER_") and f'"{flag}"' in code_text()


def _has_member(module: Module, cls: str, name: str, seen: frozenset[str] = frozenset()) -> bool:
    if name in module.classes.get(cls, ()):
        return True
    for base in module.bases.get(cls, ()):
        if base not in seen and any(
            _has_member(m, base, name, seen | {cls})
            for m in modules().values()
            if base in m.classes
        ):
            return True
    return False


def _resolve_in(module: Module, rest: list[str]) -> bool:
    if not rest:
        return True
    first, *more = rest
    if first not in module.names:
        return False
    if first in module.classes:
        return not more or (len(more) == 1 and _has_member(module, first, more[0]))
    return len(more) <= 1  # a function's or a value's attribute: not followed


def resolve(reference: str) -> bool | None:
    """True if a dotted reference names first-party code, False if it names code that is not
    there, None if it is not a reference to Python code at all."""
    words = reference.replace("/", ".").split(".")
    found = modules()
    for cut in range(len(words), 0, -1):
        if ".".join(words[:cut]) in found:
            return _resolve_in(found[".".join(words[:cut])], words[cut:])
    if words[0] in {p for p in _first_party()}:
        return False
    if words[0][:1].isupper():
        holders = [m for m in found.values() if words[0] in m.classes]
        if not holders:
            return None if len(words) > 2 else False
        return any(_resolve_in(m, words) for m in holders)
    tails = [
        m
        for name, m in found.items()
        if name.rsplit(".", 1)[-1] == words[0] and not name.startswith("tests.")
    ]
    if not tails:
        return None
    return any(_resolve_in(m, words[1:]) for m in tails)


# --- references in the documents ---------------------------------------------------------------

DOTTED = re.compile(r"^[A-Za-z_][\w/]*(\.[A-Za-z_]\w*)+(\(\S*\))?$")
TEST_REF = re.compile(
    r"^(?:tests/)?((?:unit|integration|e2e|spark|fuzz|compose)/test_\w+)(?:\.py)?(?:::(\w+))?$"
)
BARE_TEST = re.compile(r"^test_\w+$")
PATH_REF = re.compile(r"^(?:[\w.-]+/)*[\w-]+[\w.-]*$")


def _dotted(reference: str) -> str | None:
    """The Python name a reference may be, or None: a name the code writes as a string (a topic,
    a Kafka setting) is not one, and ``dir/file.Name`` is one only if ``dir/file.py`` exists."""
    reference = re.sub(r"\(.*\)$", "", reference)
    if not DOTTED.match(reference) or f'"{reference}"' in code_text():
        return None
    if "/" in reference and not _file_exists(reference.split(".")[0] + ".py"):
        return None
    return reference


@functools.cache
def defined_tests() -> dict[str, set[str]]:
    return {
        name.removeprefix("tests.").replace(".", "/"): module.names
        for name, module in modules().items()
        if name.startswith("tests.")
    }


def _file_exists(reference: str) -> bool:
    reference = reference.rstrip("/")
    if (ROOT / reference).exists():
        return True
    return any(str(p.relative_to(ROOT)).endswith("/" + reference) for p in _all_files())


@functools.cache
def _all_files() -> tuple[Path, ...]:
    skip = {".venv", ".git", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
    return tuple(p for p in ROOT.rglob("*") if not skip & set(p.parts) and p.is_file())


def problems_of(path: Path) -> list[str]:
    problems: list[str] = []
    is_design = path == DESIGN
    for reference in backquoted(path):
        reference = reference.strip()
        if m := TEST_REF.match(reference):
            names = defined_tests().get(m.group(1))
            if names is None:
                problems.append(f"no test file tests/{m.group(1)}.py")
            elif m.group(2) and m.group(2) not in names:
                problems.append(f"no test {m.group(2)} in tests/{m.group(1)}.py")
        elif BARE_TEST.match(reference):
            if not any(reference in names for names in defined_tests().values()):
                problems.append(f"no test named {reference}")
        elif (
            reference.endswith(SOURCE_SUFFIXES)
            and PATH_REF.match(reference)
            and ("/" in reference or reference.endswith(".py"))
            and not reference.startswith(".")  # a run's files (.headwater/...), not the source
        ):
            if not _file_exists(reference):
                problems.append(f"no file {reference}")
        elif dotted := _dotted(reference):
            if resolve(dotted) is False:
                problems.append(f"{dotted} is not defined")
        elif re.fullmatch(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+", reference):
            if reference not in code_words() | FOREIGN_WORDS and not _derived_variable(reference):
                problems.append(f"{reference} is not in the code")
        elif (
            is_design
            and re.fullmatch(r"_?[a-z][a-z0-9]*_[a-z0-9_]+", reference)
            and reference not in code_words() | FOREIGN_WORDS
        ):
            problems.append(f"{reference} is not in the code")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_name_a_document_cites_is_in_the_code(path: Path) -> None:
    assert problems_of(path) == []


def test_the_reference_checker_finds_what_moved() -> None:
    """The checker itself: names that exist resolve, names that moved away do not."""
    assert resolve("router.record.HEADER") is True
    assert resolve("Dispatcher.dispatch") is True
    assert resolve("router.record.no_such_thing") is False
    assert resolve("SessionManager._save_periodically") is False
    assert resolve("spark.jars.ivy") is None
    assert "claim_wills" not in code_words()


# --- Redis keys and $SYS topics ---------------------------------------------------------------

KEY_SOURCES = (ROOT / "frontend" / "sessions" / "redis.py", ROOT / "frontend" / "retained.py")


def _segments(key: str) -> list[str]:
    return key.split(":")


@functools.cache
def code_keys() -> tuple[tuple[str, ...], ...]:
    """The key shapes the stores document, ``P`` (the prefix) written as ``hw:``."""
    keys = set()
    for source in KEY_SOURCES:
        for key in re.findall(r"``(P[^`\s]+)``", source.read_text()):
            keys.add(tuple(_segments("hw:" + key[1:])))
    return tuple(sorted(keys))


def _key_fits(doc: list[str], code: tuple[str, ...]) -> bool:
    if len(doc) != len(code):
        return False
    for said, real in zip(doc, code, strict=True):
        if real.startswith("{"):
            if not (said.startswith("{") and said.endswith("}")):
                return False
        elif real.startswith("<"):
            if not said:
                return False
        elif said != real:
            return False
    return True


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_redis_key_a_document_shows_has_the_codes_shape(path: Path) -> None:
    assert code_keys(), "the stores document no keys"
    shown = [
        key.split()[-1]
        for text in backquoted(path)
        for key in re.findall(r"(?:^|\s)hw:\S+", text)
        if key.strip() != "hw:"
    ]
    assert [k for k in shown if not any(_key_fits(_segments(k), c) for c in code_keys())] == []


def test_every_sys_topic_a_document_shows_is_one_the_nodes_publish() -> None:
    systree = (ROOT / "frontend" / "systree.py").read_text()
    prefixes = re.findall(r'PREFIX\s*=\s*"(\$SYS/[^"]*)"', systree)
    assert prefixes
    shown = [t for p in DOCS for t in backquoted(p) if t.startswith("$SYS/") and t != "$SYS/..."]
    assert [t for t in shown if not (t + "/").startswith(tuple(prefixes))] == []


# --- benchmark figures in design.md -----------------------------------------------------------

UNIT = r"(?:ms|s|KiB|KB|MiB|MB|GiB|msgs?/s|deliveries/s|records/s|commands/s|/s|%|x|µs)"
FIGURE = re.compile(
    rf"(?<![\w.,/-])(\d{{1,3}}(?:,\d{{3}})+|\d+(?:\.\d+)?)(?:\s*-\s*(\d[\d,]*(?:\.\d+)?))?"
    rf"(?=\s*(?:{UNIT}(?![\w/])|a second|CONNECTs a second|threads))"
)
CITES = re.compile(
    r"docs/benchmarks\.md|\bbenchmarks\.md|make bench|make profile|python -m bench|bench\.\w+"
)
SENTENCE_END = re.compile(r"(?<=[.;:])\s+(?=[A-Z*(`])")


def sentences(text: str) -> list[str]:
    flat = prose(text)
    flat = re.sub(r"e\.g\.|i\.e\.", "eg", flat)
    out: list[str] = []
    for paragraph in re.split(r"\n\s*\n", flat):
        out += SENTENCE_END.split(" ".join(paragraph.split()))
    return out


def _number(text: str) -> Decimal:
    return Decimal(text.replace(",", ""))


@functools.cache
def benchmark_numbers() -> tuple[Decimal, ...]:
    text = BENCHMARKS.read_text()
    return tuple(
        sorted({_number(n) for n in re.findall(r"\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?", text)})
    )


def in_benchmarks(written: str) -> bool:
    value = _number(written)
    places = len(written.partition(".")[2]) if "." in written else 0
    quantum = Decimal(1).scaleb(-places)
    return any(
        n.quantize(quantum, rounding="ROUND_HALF_UP") == value
        for n in benchmark_numbers()
        if abs(n - value) <= quantum
    )


def benchmark_figures(text: str) -> list[tuple[str, str]]:
    """(figure, sentence) for every figure a benchmark-citing sentence gives."""
    found = []
    for sentence in sentences(text):
        if not CITES.search(sentence):
            continue
        for match in FIGURE.finditer(sentence):
            found += [(n, sentence) for n in match.groups() if n]
    return found


def test_every_benchmark_figure_design_cites_is_in_benchmarks_md() -> None:
    figures = benchmark_figures(DESIGN.read_text())
    assert len(figures) >= 20, (
        "design.md cites (almost) no benchmark figure: is the rule still met?"
    )
    missing = [
        f"{figure!r} in: {sentence[:160]}"
        for figure, sentence in figures
        if not in_benchmarks(figure)
    ]
    assert missing == []


def test_the_figure_rule_catches_a_figure_benchmarks_md_does_not_hold() -> None:
    text = (
        "Measured (`docs/benchmarks.md`): 5,400-7,100 CONNECTs a second; all back in 6.2-97.53 s. "
        "Settings are not figures: a 5 s timeout."
    )
    figures = [f for f, _ in benchmark_figures(text)]
    assert figures == ["5,400", "7,100", "6.2", "97.53"]
    assert [f for f in figures if not in_benchmarks(f)] == ["5,400", "7,100", "97.53"]
    held = re.findall(r"\d[\d,]*\.?\d*", BENCHMARKS.read_text())  # whatever the last run wrote
    assert held and all(in_benchmarks(figure.rstrip(".,")) for figure in held[:50])


def test_the_run_design_names_is_the_one_benchmarks_md_records() -> None:
    design, benchmarks = DESIGN.read_text(), BENCHMARKS.read_text()
    commits = set(re.findall(r"\b(?:at|commit) ([0-9a-f]{7,40})\b", design))
    times = set(re.findall(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", design))
    assert [c for c in commits if c not in benchmarks] == []
    assert [t for t in times if t not in benchmarks] == []
