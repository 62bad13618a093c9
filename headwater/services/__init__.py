"""Local stand-ins for Headwater's infrastructure: Kafka, Redis and HAProxy as child processes.

Each service is a class with `start()` returning its address and `stop()` leaving no process behind.
Children run in their own process group, so a terminal's Ctrl-C reaches only the parent, which then
stops them in reverse order of start.
"""
