"""Jobs the user writes: ``headwater analytics sql QUERY`` and ``headwater analytics run FILE``.

A user job is given the views of ``spark_streaming.views`` and returns one streaming DataFrame,
which the runner writes to the sink like a built-in job's result.

* ``sql``: ``QUERY`` is Spark SQL over ``messages`` and ``events``.
* ``run``: ``FILE`` is a Python file defining ``job(views) -> DataFrame`` (``views`` is a
  ``spark_streaming.views.Views``: ``views.messages``, ``views.events``, ``views.spark``,
  ``views.window``, ``views.watermark``, ``views.sql(query)``), and optionally
  ``mqtt_subtopic(row) -> str | None``.  The file is imported as a module on the driver.

With the MQTT sink a result row goes to ``<--mqtt-topic>/<subtopic>``: by default the row's
``subtopic`` column if it has one, else ``<--mqtt-topic>`` itself.  A user job may emit running
totals (``APPEND_ONLY`` is false); whether its query can run in the chosen output mode is Spark's
to say, when the query starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark_streaming.options import JobOptions, OptionsError
from spark_streaming.views import Views, build_views

JOB_FUNCTION = "job"


def default_subtopic(row: Mapping[str, Any]) -> str | None:
    """The row's ``subtopic`` column, if any: the results' topic below ``--mqtt-topic``."""
    value = row.get("subtopic")
    return None if value is None else str(value)


class SqlJob:
    """``headwater analytics sql QUERY``."""

    APPEND_ONLY = False

    def __init__(self, query: str) -> None:
        self.query = query

    def result(self, spark: SparkSession, options: JobOptions) -> DataFrame:
        return build_views(spark, options).sql(self.query)

    @staticmethod
    def mqtt_subtopic(row: Mapping[str, Any]) -> str | None:
        return default_subtopic(row)


class FileJob:
    """``headwater analytics run FILE``: the file's ``job(views)``."""

    APPEND_ONLY = False

    def __init__(self, path: str) -> None:
        module = _load(Path(path))
        function = getattr(module, JOB_FUNCTION, None)
        if not callable(function):
            raise OptionsError(f"run: {path} defines no function {JOB_FUNCTION}(views)")
        self.path = path
        self.function: Callable[[Views], Any] = function
        self.mqtt_subtopic: Callable[[Mapping[str, Any]], str | None] = getattr(
            module, "mqtt_subtopic", default_subtopic
        )

    def result(self, spark: SparkSession, options: JobOptions) -> DataFrame:
        result = self.function(build_views(spark, options))
        if not isinstance(result, DataFrame):
            raise OptionsError(
                f"run: {self.path}: {JOB_FUNCTION}(views) returned "
                f"{type(result).__name__}, not a DataFrame"
            )
        return result


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"headwater_job_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise OptionsError(f"run: cannot import {path} (a .py file is expected)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def user_job(options: JobOptions) -> SqlJob | FileJob:
    """The user job ``options`` names (``options.job`` is ``sql`` or ``run``)."""
    if options.job == "sql":
        return SqlJob(options.query or "")
    return FileJob(options.job_file or "")
