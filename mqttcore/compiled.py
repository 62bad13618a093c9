"""Which of the project's modules run compiled, and a refusal to run one older than its source.

``make install`` (pip's editable install of ``setup.py``) compiles the hot modules with mypyc into
C extensions beside their source, and the import system takes an extension before the ``.py``.
An extension older than its source would run code that is no longer there, silently: each
package that has compiled modules calls :func:`check` from its ``__init__`` and refuses it,
naming the file and the fix.  A file system check, not protocol logic; it lives in the core only
because the core is the package every other imports first.
"""

from __future__ import annotations

import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

PACKAGES = ("mqttcore", "router", "frontend")


def _extensions(package_dir: Path) -> dict[Path, Path]:
    """Module source -> its extension file, for the extensions built in ``package_dir`` and its
    subpackages (``frontend/auth``)."""
    found: dict[Path, Path] = {}
    for path in sorted(package_dir.rglob("*.so")):
        for suffix in EXTENSION_SUFFIXES:
            if path.name.endswith(suffix):
                found.setdefault(path.with_name(path.name[: -len(suffix)] + ".py"), path)
                break
    return found


def check(package_file: str) -> None:
    """ImportError if a module of the package whose ``__init__`` is ``package_file``, or of a
    subpackage of it, was compiled from an older version of its source."""
    for source, extension in _extensions(Path(package_file).parent).items():
        if source.exists() and source.stat().st_mtime > extension.stat().st_mtime:
            raise ImportError(
                f"{source} changed after it was compiled into {extension.name}: run `make install`"
                " to compile it again, or delete the extension to run the source"
            )


def compiled_modules() -> list[str]:
    """The project's modules imported so far that run as compiled extensions."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.split(".")[0] in PACKAGES
        and not name.endswith("__mypyc")  # the shared library the compiled modules call into
        and str(getattr(module, "__file__", "") or "").endswith(tuple(EXTENSION_SUFFIXES))
    )
