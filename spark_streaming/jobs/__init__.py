"""The analytics jobs, by name.  Each module has ``NAME``, ``APPEND_ONLY`` (can it emit running
totals, or final rows only), ``KEY`` (the columns naming one result row), a pure
``transform(df, options)`` and ``mqtt_subtopic(row)``.  They are run by ``spark_streaming.cli``
(which imports this package, never the other way round)."""

from __future__ import annotations

from types import ModuleType

from spark_streaming.jobs import device_silence, top_publishers, traffic

JOBS: dict[str, ModuleType] = {
    module.NAME: module for module in (traffic, top_publishers, device_silence)
}
