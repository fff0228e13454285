"""SESSIONS_KAFKA_CONF: the librdkafka consumer settings ingest passes through (pipelines.ingest.kafka_client), parsed
and checked against an allowlist when the configuration is read (pipelines.config), so the CLI and Dagster refuse the
same ones in one line. Errors name the key, never a value (it may be a password)."""
from __future__ import annotations

import json
import re
from collections.abc import Mapping

from pipelines.errors import ConfigError

__all__ = ["KAFKA_OWNED_SETTINGS", "check_kafka_settings", "kafka_settings"]


def kafka_settings(raw: str, name: str = "SESSIONS_KAFKA_CONF") -> dict[str, str]:
    """Consumer settings passed through to librdkafka: a JSON object (`{"security.protocol": "SASL_SSL"}`; the form
    for values holding commas) or `key=value,key=value`. Errors name the key, never a value (it may be a password)."""
    text = raw.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            raise ConfigError(f"{name} starts with '{{' but is not a JSON object") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{name} is not a JSON object")
        settings = {}
        for key, value in data.items():
            if isinstance(value, (dict, list)) or value is None:
                raise ConfigError(f"{name}: the value of {key!r} must be a string, a number or a boolean")
            settings[str(key).strip()] = str(value).lower() if isinstance(value, bool) else str(value)
        return settings
    settings = {}
    for number, item in enumerate(text.split(","), 1):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():  # not echoed: it may be the piece of a password after a comma
            raise ConfigError(f"{name}: item {number} is not key=value (the form is key=value,key=value; a value "
                              "with a comma needs the JSON object form)")
        settings[key.strip()] = value.strip()
    return settings


# librdkafka consumer settings SESSIONS_KAFKA_CONF may set: connection, security and fetch tuning. Anything else is
# refused by name -- e.g. plugin.library.paths and ssl.engine.location load shared libraries, sasl.kerberos.kinit.cmd
# runs a command -- and so are the settings exactly-once ingest owns (pipelines.ingest.kafka_client.OWNED_SETTINGS).
KAFKA_ALLOWED_PREFIXES = ("security.", "sasl.", "ssl.", "socket.", "fetch.", "reconnect.", "retry.", "metadata.",
                          "topic.metadata.", "api.version.", "broker.version.", "queued.", "connections.max.")
KAFKA_ALLOWED_KEYS = ("client.id", "client.rack", "client.dns.lookup", "group.id", "group.instance.id",
                      "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "check.crcs",
                      "coordinator.query.interval.ms", "partition.assignment.strategy", "isolation.level",
                      "message.max.bytes", "receive.message.max.bytes", "max.partition.fetch.bytes",
                      "broker.address.family", "broker.address.ttl", "enable.ssl.certificate.verification",
                      "log.connection.close")
KAFKA_REFUSED_KEYS = ("plugin.library.paths", "ssl.engine.location", "ssl.engine.id", "ssl.providers",
                      "sasl.kerberos.kinit.cmd")
# metadata.broker.list is librdkafka's other name for bootstrap.servers.
KAFKA_OWNED_SETTINGS = ("bootstrap.servers", "metadata.broker.list", "enable.auto.commit", "enable.auto.offset.store",
                        "enable.partition.eof", "auto.offset.reset")
_PROPERTY = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")  # what a librdkafka property name looks like


def check_kafka_settings(settings: Mapping[str, str], name: str = "SESSIONS_KAFKA_CONF") -> None:
    """Refuse a consumer setting outside the allowlist, in one line naming the key (never its value)."""
    for key, value in settings.items():
        if key in KAFKA_OWNED_SETTINGS:
            raise ConfigError(f"{name} may not set {key}: ingest owns it (exactly once; the bootstrap servers come "
                              "from SESSIONS_KAFKA_BOOTSTRAP)")
        if key in KAFKA_REFUSED_KEYS or not (key in KAFKA_ALLOWED_KEYS or key.startswith(KAFKA_ALLOWED_PREFIXES)):
            # A key that is no property name may be the piece of a value after a comma: not echoed either.
            what = repr(key) if _PROPERTY.fullmatch(key) else "an item that is no consumer property name (not echoed)"
            raise ConfigError(f"{name}: {what} is not an allowed consumer setting (allowed: client.id, group.id, "
                              f"session.timeout.ms and the like, {', '.join(p + '*' for p in KAFKA_ALLOWED_PREFIXES[:6])}"
                              ", ...; never a setting that loads code or runs a command)")
        if key == "isolation.level" and value.strip() != "read_committed":
            raise ConfigError(f"{name}: isolation.level may only be read_committed (any other level ingests the "
                              "messages of aborted transactions)")
