"""The file SESSIONS_SPEC names (a local path or s3://bucket/key), read once and parsed into a SessionSpec
(pipelines.core.spec: the pure rules). Read by pipelines.config; below pipelines.storage, which imports the config."""
from __future__ import annotations

from pathlib import Path

from pipelines.core.spec import DEFAULT_SPEC, SessionSpec, parse_spec
from pipelines.errors import ConfigError
from pipelines.locations import s3_filesystem

__all__ = ["MAX_SPEC_BYTES", "read_spec"]

MAX_SPEC_BYTES = 1 << 20  # a spec is a page of YAML: anything this big is the wrong file


def _read(uri: str) -> bytes:
    if uri.startswith("s3://"):
        with s3_filesystem().open_input_stream(uri.removeprefix("s3://")) as stream:
            return bytes(stream.read(MAX_SPEC_BYTES + 1))
    with Path(uri.removeprefix("file://")).expanduser().open("rb") as handle:
        return handle.read(MAX_SPEC_BYTES + 1)


def read_spec(uri: str) -> SessionSpec:
    """The spec in the file at `uri`; the default spec when `uri` is empty. Any refusal is one ConfigError line."""
    if not uri:
        return DEFAULT_SPEC
    try:
        data = _read(uri)
    except FileNotFoundError:
        raise ConfigError(f"SESSIONS_SPEC={uri}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"SESSIONS_SPEC={uri}: a directory, not a spec file") from None
    except OSError as error:  # pyarrow's S3 errors are OSErrors too
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(f"SESSIONS_SPEC={uri}: cannot be read: {reason}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise ConfigError(f"SESSIONS_SPEC={uri}: more than {MAX_SPEC_BYTES} bytes: not a spec file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(f"SESSIONS_SPEC={uri}: not UTF-8 text") from None
    return parse_spec(text, source=uri)
