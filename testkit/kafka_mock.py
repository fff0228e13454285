"""librdkafka's mock cluster (from the confluent-kafka wheel), driven through its C API with ctypes: a Kafka-protocol
broker on loopback for the Kafka benchmark (benchmarks/kafka_ingest.py). It is a mock, not Apache Kafka: no real
retention settings, disk, replication or transactions. The tests use Apache Kafka's own broker (tests/kafka_broker.py);
tests/test_kafka_ingest.py's docstring says why none of them needs the mock."""
from __future__ import annotations

import ctypes
import glob
from pathlib import Path

from testkit.kafka_produce import produce


class MockCluster:
    """A librdkafka mock cluster (one broker) this process controls; `bootstrap` is its host:port."""

    def __init__(self) -> None:
        import confluent_kafka

        libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
        found = glob.glob(str(libs / "librdkafka*.so*"))
        if not found:
            raise RuntimeError(f"no bundled librdkafka under {libs}: the mock cluster's C API is needed")
        lib = ctypes.CDLL(found[0])
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        for name, restype, argtypes in [
            ("rd_kafka_conf_new", vp, []),
            ("rd_kafka_new", vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
            ("rd_kafka_destroy", None, [vp]),
            ("rd_kafka_mock_cluster_new", vp, [vp, ctypes.c_int]),
            ("rd_kafka_mock_cluster_destroy", None, [vp]),
            ("rd_kafka_mock_cluster_bootstraps", cp, [vp]),
            ("rd_kafka_mock_topic_create", ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
            ("rd_kafka_mock_topic_delete", ctypes.c_int, [vp, cp]),
            ("rd_kafka_mock_partition_delete_records", ctypes.c_int, [vp, cp, ctypes.c_int32, ctypes.c_int64]),
            ("rd_kafka_mock_broker_set_down", ctypes.c_int, [vp, ctypes.c_int32]),
            ("rd_kafka_mock_broker_set_up", ctypes.c_int, [vp, ctypes.c_int32]),
        ]:
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        self.lib = lib
        errors = ctypes.create_string_buffer(512)
        self.handle = lib.rd_kafka_new(0, lib.rd_kafka_conf_new(), errors, 512)  # a bare producer owning the mock
        assert self.handle, errors.value
        self.cluster = lib.rd_kafka_mock_cluster_new(self.handle, 1)
        self.bootstrap = lib.rd_kafka_mock_cluster_bootstraps(self.cluster).decode()

    def create_topic(self, topic: str, partitions: int) -> None:
        assert self.lib.rd_kafka_mock_topic_create(self.cluster, topic.encode(), partitions, 1) == 0

    def delete_topic(self, topic: str) -> None:
        assert self.lib.rd_kafka_mock_topic_delete(self.cluster, topic.encode()) == 0

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        assert self.lib.rd_kafka_mock_partition_delete_records(self.cluster, topic.encode(), partition, before) == 0

    def broker_down(self) -> None:
        """The broker closes its connections and refuses new ones (Connection refused) until broker_up."""
        assert self.lib.rd_kafka_mock_broker_set_down(self.cluster, 1) == 0

    def broker_up(self) -> None:
        assert self.lib.rd_kafka_mock_broker_set_up(self.cluster, 1) == 0

    def produce(self, topic: str, values: list[tuple[str | None, bytes | None]],
                partition: int | None = None) -> list[tuple[int, int, bytes | None]]:
        """(key, value) messages -> (partition, offset, value) as the broker acknowledged them, in send order."""
        return produce(self.bootstrap, topic, values, partition=partition)

    def close(self) -> None:
        self.lib.rd_kafka_mock_cluster_destroy(self.cluster)
        self.lib.rd_kafka_destroy(self.handle)
