"""Headwater's benchmark: throughput, latency and interest routing against mosquitto and amqtt.

``python -m bench`` (``make bench``) starts each broker in turn as child processes on loopback
ports (:mod:`bench.brokers`), drives it with raw-socket load generators built on Headwater's own
codec (:mod:`bench.load`) through the scenarios of :mod:`bench.scenarios` (the paced QoS 1
fan-in of :mod:`bench.paced`, the worker scaling of :mod:`bench.worker_scaling`), stops it, and
writes the markdown report of :mod:`bench.report` to ``docs/benchmarks.md``.  It is a
measurement, not a test: it asserts nothing and reports whether the targets were met, and by how
much they were missed (:mod:`bench.targets`).
"""
