"""The Arrow types the product computes on, whatever layout a writer chose.

delta-rs (DataFusion) returns and writes strings as `string_view`; other writers use `large_string`, the binary kinds
or dictionary encoding. pyarrow lacks kernels for some of these (`filter` of a `string_view` column fails), and
mixing layouts fails a concat. Every read of a table's rows -- through delta-rs (pipelines.storage.read_rows) or file
by file (pipelines.data_files) -- ends here, so no other code sees anything but the plain types.
"""
from __future__ import annotations

import pyarrow as pa

__all__ = ["plain_field", "plain_type", "plain_types"]


def plain_type(kind: pa.DataType) -> pa.DataType:
    """The plain Arrow type readers compute on: `string` for any string layout (view, large, dictionary of strings),
    `binary` for any binary layout; nested types by their children; any other type as it is."""
    if pa.types.is_dictionary(kind):
        return plain_type(kind.value_type)
    if pa.types.is_string_view(kind) or pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_binary_view(kind) or pa.types.is_large_binary(kind):
        return pa.binary()
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind)
            or pa.types.is_large_list_view(kind)):
        return pa.list_(plain_field(kind.value_field))
    if pa.types.is_struct(kind):
        return pa.struct([plain_field(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        return pa.map_(plain_type(kind.key_type), plain_field(kind.item_field))
    return kind


def plain_field(of: pa.Field) -> pa.Field:
    return of.with_type(plain_type(of.type))


def plain_types(data: pa.Table) -> pa.Table:
    """`data` with every column in its plain type (a no-op, no copy, when they all are already)."""
    plain = pa.schema([plain_field(f) for f in data.schema], metadata=data.schema.metadata)
    return data if plain.equals(data.schema) else data.cast(plain)
