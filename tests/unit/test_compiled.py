"""The hot path runs compiled (setup.py's mypyc extensions), and never older than its source."""

from __future__ import annotations

import ast
import importlib
import os
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from mqttcore import compiled

ROOT = Path(__file__).parents[2]


def listed() -> list[str]:
    """setup.py's COMPILED, read without running setup.py."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "COMPILED":
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no COMPILED list")


def test_every_listed_module_runs_compiled_unless_installed_pure() -> None:
    names = [path.removesuffix(".py").replace("/", ".") for path in listed()]
    files = {name: str(importlib.import_module(name).__file__) for name in names}
    extensions = {name for name, file in files.items() if file.endswith(tuple(EXTENSION_SUFFIXES))}
    if os.environ.get("HEADWATER_COMPILE") == "0":
        assert not extensions
    else:
        assert extensions == set(names), f"running from source: {set(names) - extensions}"
        assert set(names) <= set(compiled.compiled_modules())


def test_an_extension_older_than_its_source_is_refused(tmp_path: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hot.py").write_text("X = 1\n")
    extension = package / f"hot{EXTENSION_SUFFIXES[0]}"
    extension.write_bytes(b"")
    (package / f"shared__mypyc{EXTENSION_SUFFIXES[0]}").write_bytes(b"")  # no source: not judged
    now = time.time()
    os.utime(package / "hot.py", (now - 10, now - 10))
    compiled.check(str(package / "__init__.py"))  # compiled after its source was written
    os.utime(package / "hot.py", (now, now))
    os.utime(extension, (now - 10, now - 10))
    with pytest.raises(ImportError, match=r"hot\.py changed after it was compiled.*make install"):
        compiled.check(str(package / "__init__.py"))


def test_an_extension_older_than_its_source_in_a_subpackage_is_refused(tmp_path: Path) -> None:
    sub = tmp_path / "package" / "auth"
    sub.mkdir(parents=True)
    (sub / "acl.py").write_text("X = 1\n")
    extension = sub / f"acl{EXTENSION_SUFFIXES[0]}"
    extension.write_bytes(b"")
    now = time.time()
    os.utime(extension, (now - 10, now - 10))
    with pytest.raises(ImportError, match=r"auth/acl\.py changed after it was compiled"):
        compiled.check(str(tmp_path / "package" / "__init__.py"))


def test_the_node_image_carries_every_compiled_module() -> None:
    """A compiled module that meets a class of another compiled module refuses the interpreted
    one: an image without frontend/auth's extension closed every CONNECT with an internal
    error.  The image's build stage compiles what setup.py lists; the node stage must copy each
    directory's extensions."""
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    for directory in sorted({str(Path(path).parent) for path in listed()}):
        line = f"COPY --from=compiled /app/{directory}/*.so ./{directory}/"
        assert line in dockerfile, f"docker/Dockerfile lacks: {line}"
        assert f"COPY {directory.split('/')[0]} ./{directory.split('/')[0]}" in dockerfile
