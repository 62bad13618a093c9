"""The Avro schemas of the log, shipped as package data (``importlib.resources``)."""
