"""Harnesses shared by the test suite (tests/) and the benchmarks (benchmarks/): librdkafka's mock Kafka cluster
(kafka_mock), the seeded crash campaign (campaign), the independent oracle the sessions are checked against (oracle)
and its adapter for the lifecycle tests' batches (lifecycle_expectations).

Not part of the installed product (pyproject's package list leaves it out): only tests/ and benchmarks/ import it,
never pipelines/, state_store/, assets/ or sessionctl/. It imports nothing from tests/.
"""
