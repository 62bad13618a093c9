"""Analytics on Headwater's log with Spark Structured Streaming (``headwater analytics``).

``source`` builds the session and decodes the log, ``jobs`` holds one module per job with a pure
``transform``, ``sinks`` and ``mqtt_sink`` write results, ``runner`` runs one query and ``cli``
parses the command line.  See docs/analytics.md.
"""
