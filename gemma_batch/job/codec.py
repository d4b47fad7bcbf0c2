"""Exact conversion between output rows and journal lines, driven by the Arrow schema.

A journal line is one compact JSON object (UTF-8, no raw newline: JSON escapes them) ending in
"\\n". Each column's value is encoded by a function chosen from its Arrow type, so that decoding
the line and building an Arrow array of that type gives back the very value the row held:

- bool, integers, strings: as JSON; floats as JSON numbers (Python's repr round-trips every
  double exactly; NaN and +-Infinity use Python's JSON extensions);
- binary: base64; decimal: the decimal's string;
- timestamp / date / time / duration: the raw integer Arrow stores (Arrow builds these types
  from integers), so no precision is lost to Python's datetime;
- list / struct / map / dictionary: recursively, by their value types.

Encoding also validates (types, nulls in non-nullable columns, unencodable strings such as lone
surrogates), so a bad row is refused by `commit` instead of breaking every later compaction.
Other Arrow types (intervals, unions, extension types) are refused when the codec is built.
"""

from __future__ import annotations

import base64
import json
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.types as pt

Convert = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _expect(kind: type, what: str) -> Convert:
    def check(value: Any) -> Any:
        if not isinstance(value, kind):
            raise TypeError(f"expected {what}, got {type(value).__name__}")
        return value

    return check


def _to_float(value: Any) -> float:
    if not isinstance(value, numbers.Real):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _optional(convert: Convert) -> Convert:
    return lambda value: None if value is None else convert(value)


def _temporal(t: pa.DataType) -> Convert:
    physical = pa.int32() if t.bit_width == 32 else pa.int64()
    return lambda value: pa.scalar(value, type=t).cast(physical).as_py()


def _decimal(t: pa.DataType) -> Convert:
    return lambda value: str(pa.scalar(value, type=t).as_py())


def _binary(value: Any) -> str:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, got {type(value).__name__}")
    return base64.b64encode(value).decode("ascii")


def _codec(t: pa.DataType) -> tuple[Convert, Convert]:
    """(encode, decode) for non-null values of type `t`; TypeError if `t` is not supported."""
    if pt.is_boolean(t):
        return _expect(bool, "a bool"), _identity
    if pt.is_integer(t):
        return operator.index, _identity
    if pt.is_floating(t):
        return _to_float, _identity
    if pt.is_string(t) or pt.is_large_string(t) or pt.is_string_view(t):
        return _expect(str, "a str"), _identity
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t) or pt.is_binary_view(t):
        return _binary, base64.b64decode
    if pt.is_decimal(t):
        return _decimal(t), Decimal
    if pt.is_timestamp(t) or pt.is_date(t) or pt.is_time(t) or pt.is_duration(t):
        return _temporal(t), _identity
    if pt.is_dictionary(t):
        return _codec(t.value_type)
    if (
        pt.is_list(t)
        or pt.is_large_list(t)
        or pt.is_fixed_size_list(t)
        or pt.is_list_view(t)
        or pt.is_large_list_view(t)
    ):
        enc, dec = (_optional(f) for f in _codec(t.value_type))
        return (lambda v: [enc(x) for x in v]), (lambda v: [dec(x) for x in v])
    if pt.is_struct(t):
        fields = [(f.name, *(_optional(c) for c in _codec(f.type))) for f in t]
        return (
            lambda v: {name: enc(v.get(name)) for name, enc, _ in fields},
            lambda v: {name: dec(v[name]) for name, _, dec in fields},
        )
    if pt.is_map(t):
        kenc, kdec = _codec(t.key_type)
        venc, vdec = (_optional(f) for f in _codec(t.item_type))
        return (
            lambda v: [
                [kenc(k), venc(x)] for k, x in (v.items() if isinstance(v, Mapping) else v)
            ],
            lambda v: [(kdec(k), vdec(x)) for k, x in v],
        )
    raise TypeError(f"Arrow type {t} cannot be stored in the result journal")


class RowCodec:
    """Encodes rows of `schema` (dicts keyed by field name) as journal lines and back."""

    _json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._names = frozenset(schema.names)
        self._fields: list[tuple[str, bool, Convert, Convert]] = []
        for f in schema:
            try:
                enc, dec = _codec(f.type)
            except TypeError as e:
                raise TypeError(f"column {f.name!r}: {e}") from None
            self._fields.append((f.name, f.nullable, enc, dec))

    def encode(self, row: Mapping[str, Any]) -> bytes:
        """One journal line for `row`; ValueError/TypeError if it does not fit the schema."""
        if row.keys() != self._names:
            missing, extra = sorted(self._names - row.keys()), sorted(row.keys() - self._names)
            raise ValueError(f"row does not match the output schema: missing {missing}, extra {extra}")
        obj: dict[str, Any] = {}
        for name, nullable, enc, _ in self._fields:
            value = row[name]
            if value is not None:
                try:
                    value = enc(value)
                except (TypeError, ValueError, pa.ArrowException) as e:
                    raise TypeError(f"column {name!r}: {e}") from None
            elif not nullable:
                raise ValueError(f"column {name!r} must not be null")
            obj[name] = value
        return (self._json.encode(obj) + "\n").encode()

    def decode(self, lines: Sequence[bytes]) -> pa.Table:
        """The rows of `lines` (journal lines from `encode`) as a table of the schema, in order."""
        objs = [json.loads(line) for line in lines]
        arrays = []
        for f, (name, _, _, dec) in zip(self.schema, self._fields):
            if dec is _identity:
                values = [o[name] for o in objs]
            else:
                values = [None if (v := o[name]) is None else dec(v) for o in objs]
            arrays.append(pa.array(values, type=f.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)


def journal_line_index(line: bytes) -> int | None:
    """The row index of a complete, parseable journal line, else None."""
    if not line.endswith(b"\n"):
        return None
    try:
        index = json.loads(line).get("row")
    except (ValueError, AttributeError):
        return None
    return index if type(index) is int and index >= 0 else None
