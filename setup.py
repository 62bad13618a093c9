"""The build: the hot path (protocol core, router, connection) compiled with mypyc.

Everything else is in pyproject.toml.  The modules of :data:`COMPILED` stay Python source (the
source is what is read, typed and tested); mypyc turns each into a C extension built beside it,
which the import system takes before the ``.py``.  ``HEADWATER_COMPILE=0`` builds pure Python
(no C compiler needed); docs/benchmarks.md shows what compiling gains.
"""

from __future__ import annotations

import os
from importlib.util import find_spec

from setuptools import setup

COMPILED = [
    "mqttcore/codec.py",
    "mqttcore/message.py",
    "mqttcore/channel.py",
    "mqttcore/session.py",
    "mqttcore/topics.py",
    "mqttcore/bodies.py",
    "router/record.py",
    "router/subscriptions.py",
    "router/index.py",
    "router/dispatch.py",
    "router/partitioner.py",
    "router/delivery.py",
    "router/topics.py",
    "router/history.py",  # a compiled class (Session) has only compiled subclasses (HistoryView)
    "router/log.py",
    "router/outbox.py",
    "router/reader.py",
    "router/catchup.py",
    "router/backlog.py",
    "frontend/publishing.py",
    "frontend/connection.py",
    "frontend/intake.py",
    "frontend/events.py",  # a burst of client events built and handed over in one loop
    "frontend/auth/acl.py",  # Access.may_read: asked for every message a client is sent
    # the CONNECT path: a session's acquire and release, their Redis batches, the CONNECT
    # deadline and the PROXY header (docs/benchmarks.md: 7-22% less node CPU a clean CONNECT
    # cycle, 5-11% a persistent one)
    "router/batching.py",
    "frontend/sessions/manager.py",
    "frontend/sessions/saver.py",
    "frontend/sessions/redis.py",
    "frontend/deadlines.py",
    "frontend/proxy_protocol.py",
]


def ext_modules() -> list[object]:
    if os.environ.get("HEADWATER_COMPILE", "1") == "0":
        return []
    missing = [name for name in ("mypyc", "redis", "confluent_kafka") if find_spec(name) is None]
    if missing:  # mypyc types the sources as mypy does: against the installed dependencies
        raise SystemExit(
            f"setup.py: {', '.join(missing)} not installed. The hot path is compiled against the"
            " project's dependencies and mypy: install them first, then build with"
            " --no-build-isolation (`make install` does), or set HEADWATER_COMPILE=0"
        )
    from mypyc.build import mypycify

    # group_name: the modules' shared library is mqttcore/native__mypyc*.so, inside a package, so
    # that any installation that finds the packages finds it too
    return mypycify(COMPILED, opt_level="3", group_name="mqttcore.native")


setup(ext_modules=ext_modules())
