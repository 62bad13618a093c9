"""The atheris entry point: coverage-guided fuzzing of ``harness.run`` (docs/fuzzing.md).

    python tests/fuzz/fuzz_mqtt.py [libFuzzer flags] NEW_CORPUS_DIR [SEED_DIR ...]

``mqttcore`` and the harness are instrumented as they are imported, so libFuzzer's coverage
(``cov:``, ``ft:``) counts their branches.  libFuzzer writes the inputs it finds interesting to
the first directory, and a crashing input to ``-artifact_prefix``; any exception that escapes
``run`` is a crash.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports(include=["mqttcore", "tests.fuzz"]):
    from tests.fuzz.harness import run


def test_one_input(data: bytes) -> None:
    run(data)


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
