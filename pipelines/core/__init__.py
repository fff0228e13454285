"""The pure sessionization core: the rules (sessionize), the open-session state format, and sample data.

No Spark import here (held by tests/test_rooms.py): the Spark job, the JVM operator's tests and the oracle all
stand on these definitions."""
