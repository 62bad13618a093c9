"""Headwater's benchmark, one tool: ``python -m bench <subcommand>`` (:mod:`bench.__main__`).

Headwater is started as a user starts it (``headwater dev up``, :mod:`bench.brokers`), beside
mosquitto (and amqtt), and driven by a load generator that imports nothing of the product: raw
MQTT 3.1.1 on a codec of its own (:mod:`bench.mqtt`, :mod:`bench.load`).  What the machine
says (``/proc``, percentiles) is read in :mod:`bench.measure`; each subcommand writes its section
of ``docs/benchmarks.md`` through :mod:`bench.report`.  It is a measurement, not a test.
"""
