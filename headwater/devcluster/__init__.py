"""`headwater dev up|down|status|restart|roll`: a whole Headwater cluster on one machine.

`up` makes the dev CA on first use, then starts, in order, Kafka, Redis, the project's topics, N
front-end nodes and HAProxy (plain MQTT, TLS and WebSocket ports, PROXY v2 to the nodes), recording
each child in a state file as soon as it runs; while up, its supervisor starts again any child
that exits (`supervisor`); it stops them in reverse order on Ctrl-C or SIGTERM. `down` signals a
running `up` through that state file, and kills whatever a dead `up` left behind. `status`,
`restart` and `roll` (`control`) read the state file and signal the nodes.
"""
