"""Finding a Java runtime good enough for Kafka 4.x (Java 17 or newer).

JAVA_HOME wins over PATH, as in Kafka's own scripts. The version is read from `java -version`, whose
first line quotes it (`"17.0.15"`, or `"1.8.0_392"` for the old numbering).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path

from headwater.errors import MissingProgramError
from headwater.services.process import find_program

MIN_JAVA = 17
JAVA_HINT = (
    "Java 17+ is required to run the local Kafka: "
    "install openjdk-17-jre-headless or set HEADWATER_KAFKA_BOOTSTRAP"
)
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def find_java(env: Mapping[str, str] = os.environ) -> str | None:
    """JAVA_HOME/bin/java if it exists, else `java` on PATH, else None."""
    home = env.get("JAVA_HOME", "").strip()
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return find_program("java", sbin=False)


def java_major_version(java: str) -> int | None:
    """The major version `java -version` reports, or None if it cannot be run or read."""
    try:
        result = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(result.stderr + result.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def require_java(env: Mapping[str, str] = os.environ) -> str:
    """The path of a Java 17+ executable, or a MissingProgramError saying what to install."""
    java = find_java(env)
    if java is None:
        raise MissingProgramError(JAVA_HINT)
    major = java_major_version(java)
    if major is None or major < MIN_JAVA:
        found = "an unreadable version" if major is None else f"Java {major}"
        raise MissingProgramError(f"{JAVA_HINT} (found {found} at {java})")
    return java
