"""``--payload-schema``: the shape of JSON payloads, as Spark's ``from_json`` takes it.

The flag is either a Spark DDL string (``"c DOUBLE, unit STRING"``), handed to Spark unchanged
(Spark parses it when the query is built, and a bad one is reported as its ``ParseException``),
or the path of a JSON Schema file, translated here into a ``StructType``: ``object`` with
``properties`` -> struct (properties in the file's order), ``array`` with ``items`` -> array,
``string`` -> string (``format: date-time`` -> timestamp), ``integer`` -> bigint, ``number`` ->
double, ``boolean`` -> boolean; a list of types with ``null`` is the other type (every Spark
field is nullable).  Anything else (``$ref``, ``oneOf``, a type without properties or items) is an
``OptionsError`` naming the flag and the JSON pointer, raised before Spark starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_streaming.options import OptionsError

FLAG = "--payload-schema"
_SCALARS: dict[str, DataType] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
}


def is_schema_file(value: str) -> bool:
    """True if ``value`` names a JSON Schema file rather than being a DDL string."""
    return value.endswith(".json") or Path(value).is_file()


def payload_schema(value: str) -> str | StructType:
    """What ``from_json`` gets for ``--payload-schema value``: the DDL string, or the
    ``StructType`` of the JSON Schema file ``value``."""
    if not is_schema_file(value):
        return value
    try:
        document = json.loads(Path(value).read_text())
    except (OSError, ValueError) as exc:
        raise OptionsError(f"{FLAG}: cannot read JSON Schema {value}: {exc}") from None
    spark_type = to_spark_type(document, "#")
    if not isinstance(spark_type, StructType):
        raise OptionsError(f'{FLAG}: {value}: the schema must be of "type": "object"')
    return spark_type


def to_spark_type(schema: Any, pointer: str) -> DataType:
    """The Spark type of the JSON Schema ``schema`` found at ``pointer``."""
    if not isinstance(schema, dict):
        raise OptionsError(f"{FLAG}: {pointer}: expected a schema object")
    kind = _type_name(schema, pointer)
    if kind == "object":
        return _struct(schema, pointer)
    if kind == "array":
        if "items" not in schema:
            raise OptionsError(f'{FLAG}: {pointer}: an "array" needs "items"')
        return ArrayType(to_spark_type(schema["items"], f"{pointer}/items"))
    if kind == "string" and schema.get("format") == "date-time":
        return TimestampType()
    if kind in _SCALARS:
        return _SCALARS[kind]
    raise OptionsError(f"{FLAG}: {pointer}: unsupported type {kind!r}")


def _type_name(schema: dict[str, Any], pointer: str) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        kind = others[0] if len(others) == 1 else None
    if not isinstance(kind, str):
        raise OptionsError(f'{FLAG}: {pointer}: expected one "type" (optionally with "null")')
    return kind


def _struct(schema: dict[str, Any], pointer: str) -> StructType:
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        raise OptionsError(f'{FLAG}: {pointer}: an "object" needs "properties"')
    return StructType(
        [
            StructField(name, to_spark_type(sub, f"{pointer}/properties/{name}"), True)
            for name, sub in properties.items()
        ]
    )
