"""Kafka's jars, resolved by Maven once and reused offline from then on.

`kafka/pom.xml` names Kafka and a log4j2 binding. The first call to `classpath()` runs
`mvn dependency:copy-dependencies` into `<cache>/kafka-<version>/lib` (cache: HEADWATER_CACHE, else
~/.cache/headwater) and marks the directory complete with the pom's digest. Later calls find the
mark and return `<lib>/*` without invoking Maven, so they need neither Maven nor a network; an
edited pom changes the digest and triggers one new resolution.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from headwater.errors import MissingProgramError, ServiceError
from headwater.services.process import find_program
from headwater.settings import cache_root

KAFKA_VERSION = "4.1.2"
MARK_FILE = ".headwater-resolved"
MAVEN_HINT = (
    "Maven is needed once to fetch Kafka's jars: install maven (apt-get install maven) "
    "or set HEADWATER_KAFKA_BOOTSTRAP"
)


def pom_path() -> Path:
    """The pom in the source checkout (kafka/pom.xml at the repository root)."""
    return Path(__file__).resolve().parents[2] / "kafka" / "pom.xml"


def lib_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where the resolved jars live."""
    return cache_root(env) / f"kafka-{KAFKA_VERSION}" / "lib"


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def resolved_classpath(env: Mapping[str, str] = os.environ) -> str | None:
    """The classpath if the jars are already resolved for the current pom, else None."""
    lib, pom = lib_dir(env), pom_path()
    mark = lib / MARK_FILE
    if not mark.is_file():
        return None
    if pom.is_file() and mark.read_text().strip() != _pom_digest(pom):
        return None
    return f"{lib}/*"


def classpath(env: Mapping[str, str] = os.environ) -> str:
    """The classpath of Kafka's jars, resolving them with Maven the first time."""
    return resolved_classpath(env) or fetch(env)


def fetch(env: Mapping[str, str] = os.environ) -> str:
    """Resolve the jars with Maven into the cache (a no-op if already there)."""
    existing = resolved_classpath(env)
    if existing is not None:
        return existing
    pom = pom_path()
    if not pom.is_file():
        raise ServiceError(f"Kafka's jars are not in {lib_dir(env)} and {pom} is missing")
    mvn = find_program("mvn", sbin=False)
    if mvn is None:
        raise MissingProgramError(MAVEN_HINT)
    _copy_dependencies(mvn, pom, lib_dir(env))
    return f"{lib_dir(env)}/*"


def _copy_dependencies(mvn: str, pom: Path, lib: Path) -> None:
    staging = lib.with_name(lib.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    argv = [
        mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise ServiceError(f"Maven could not resolve Kafka's jars ({' '.join(argv)}):\n{tail}")
    (staging / MARK_FILE).write_text(_pom_digest(pom) + "\n")
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)
