"""The one result convention: an operation returns a frozen dataclass, read by attribute; `to_dict()` is its JSON
shape (what sessionctl prints and Dagster ops pass on). Results of the job (pipelines.ingest.IngestResult) and of the
lifecycle library (state_store.results) share this base."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any, ClassVar

__all__ = ["Result"]


class Result:
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every result is a dataclass

    # Keys that were only present when set: left out of to_dict() while None, so the JSON keeps its shape.
    _omit_if_none: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in self._omit_if_none:
            if out[name] is None:
                del out[name]
        return out
