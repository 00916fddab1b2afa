"""A fast path for decoding records, derived from the pydantic models (for the ledger's hot loop).

msgspec decodes msgpack and checks types and constraints in one C pass: about half the CPU of
msgpack + pydantic, which the ledger spends on every event it records. Its types are generated here
from the pydantic records (`swarmrl.schemas.events`), never written by hand, so the contract keeps
one definition.

It is a fast path only. A generated type is at least as strict as its model, so what it accepts the
codec would accept with the same field values; whatever it refuses, the caller decodes again with
`swarmrl.schemas.codec`, whose verdict and reason stand. Where msgspec is more lenient than pydantic
or the codec, a check after decoding closes the gap:

- `v` is required (the codec refuses a record without a supported version);
- floats must be finite (`allow_inf_nan=False`; msgspec has no such constraint);
- free-form values (`Any`) hold only str, int, float, bool, None, lists and str-keyed maps (the
  codec refuses msgpack `bin` and non-string keys; msgspec would decode them, and ext types too);
- a pattern's closing `$` becomes `\\Z` (Python's `$` also matches before a final newline; the
  Rust regex pydantic uses does not);
- a model's `mode="after"` validators run on the decoded object.

Lax conversions pydantic makes (`3.0` or `"3"` for an int, `0`/`1` for a bool) are refused here and
so left to the codec. A model using anything this module does not translate (field validators,
other constraints, other types) gets no fast path: `FastDecoder.for_model` returns None.

Decoded objects are msgspec Structs with the model's attributes (`kind` included for events);
`fields` gives the same dict as a model's `__dict__`, `model_of` the model.

`packed=True` (the ledger's choice): required `list[int]` and `list[float]` fields (token ids,
logprobs) come as `array.array` (`"q"`, `"d"`) instead of lists. The small C module `_numbers`
reads them straight from the msgpack bytes and hands msgspec the payload with nil in their place
(`_numbers.split`), so msgspec never walks the numbers: about a sixth of the CPU of Python numbers
packed again. On the same walk it checks that free-form values are plain data (instead of `_plain`
in Python after decoding, which cost the ledger ~3% of its CPU). Without a C compiler at install time
that module is missing, and such fields are lists and checked in Python as usual.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from array import array
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

import msgspec
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from swarmrl.schemas.events import SUPPORTED_VERSIONS

try:
    from swarmrl.schemas import _numbers  # type: ignore[attr-defined]  # C, built by pip when it can
except ImportError:  # no compiler when installed: lists, as without `packed`
    _numbers = None

PACKED = _numbers is not None
"""Whether `packed=True` packs numbers (the C module `_numbers` is built)."""

_CONSTRAINTS = ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")
"""pydantic constraints with the same meaning in `msgspec.Meta`."""
_CONFIG = frozenset(
    {"extra", "frozen", "allow_inf_nan", "populate_by_name", "validate_by_alias", "validate_by_name", "title"}
)
"""Model settings this module mirrors or that do not change what validation accepts; any other
(`str_strip_whitespace`, `coerce_numbers_to_str`, ...) might, so such a model gets no fast path."""

Check = Callable[[Any], bool]
Pack = tuple[str, int, str]
"""A packed field: its name, its place in the decoder's `_numbers.split` fields, its array typecode."""


class Unsupported(TypeError):
    """A model, field or type this module does not translate: the model gets no fast path."""


def _meta(metadata: list[Any], where: str) -> msgspec.Meta | None:
    """`msgspec.Meta` of a field's pydantic constraints (annotated-types objects, pydantic's own)."""
    found: dict[str, Any] = {}
    for item in metadata:
        if dataclasses.is_dataclass(item):
            pairs = [(f.name, getattr(item, f.name)) for f in dataclasses.fields(item)]
        else:
            pairs = list(vars(item).items())
        for name, value in pairs:
            if value is None:
                continue
            if name not in _CONSTRAINTS:
                raise Unsupported(f"{where}: constraint {name}={value!r}")
            if name == "pattern":
                if not value.endswith("$") or value.endswith("\\$"):
                    raise Unsupported(f"{where}: pattern {value!r} is not anchored with a closing $")
                value = value[:-1] + "\\Z"
            found[name] = value
    return msgspec.Meta(**found) if found else None


def _plain(value: Any) -> bool:
    """True if `value` holds only what the codec lets into a free-form field (see the module doc)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            for key in item:
                if type(key) is not str:
                    return False
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind not in (str, int, float, bool, type(None)):
            return False
    return True


def _finite_all(values: Any) -> bool:
    # One C loop; an overflowing sum of finite values only sends the record to the codec.
    return math.isfinite(sum(values))


def _translate(tp: Any, where: str, finite: bool) -> tuple[Any, Check | None]:
    """The msgspec type for pydantic annotation `tp`, and the check its values need after decoding."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        inner, extra = _translate(args[0], where, finite)
        metadata: list[Any] = []
        for item in args[1:]:
            metadata.extend(item.metadata if isinstance(item, FieldInfo) else [item])
        meta = _meta(metadata, where)
        return (Annotated[inner, meta] if meta else inner), extra
    if tp in (str, int, bool):
        return tp, None
    if tp is float:
        return float, math.isfinite if finite else None
    if tp is Any:
        return Any, _plain
    if origin is Literal and all(type(a) is str for a in args):
        return tp, None
    if origin in (Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner, check = _translate(next(a for a in args if a is not type(None)), where, finite)
        if check is None or check is _plain:  # `_plain(None)` holds
            return inner | None, check
        return inner | None, lambda x: x is None or check(x)
    if origin is list and len(args) == 1:
        inner, check = _translate(args[0], where, finite)
        if check is None:
            return list[inner], None  # type: ignore[valid-type]
        if args[0] is float:
            return list[float], _finite_all
        if check is _plain:  # one walk over the whole value
            return list[inner], _plain  # type: ignore[valid-type]
        return list[inner], lambda xs: all(map(check, xs))  # type: ignore[valid-type]
    if origin is dict and len(args) == 2 and args[0] is str:
        inner, check = _translate(args[1], where, finite)
        if check is None:
            return dict[str, inner], None  # type: ignore[valid-type]
        if args[1] is float:
            return dict[str, float], lambda d: _finite_all(d.values())
        if check is _plain:
            return dict[str, inner], _plain  # type: ignore[valid-type]
        return dict[str, inner], lambda d: all(map(check, d.values()))  # type: ignore[valid-type]
    raise Unsupported(f"{where}: type {tp!r}")


def _tag(model: type[BaseModel], tag_field: str | None) -> str | None:
    if tag_field is None:
        return None
    info = model.model_fields[tag_field]
    if typing.get_origin(info.annotation) is not Literal or len(typing.get_args(info.annotation)) != 1:
        raise Unsupported(f"{model.__name__}.{tag_field}: a tag must be one Literal value")
    return typing.get_args(info.annotation)[0]


_SPLIT_KINDS = {"q": 0, "d": 1, "plain": 2}
"""How `_numbers.split` reads a field, by the code `_struct` gives it: ints or floats into an array of
that typecode, or (`plain`) checked for plain data where it stands."""


def _packing(tp: Any, finite: bool) -> str | None:
    """The array typecode a `packed` decoder gives a field of annotation `tp`; None: not packed."""
    if _numbers is None or typing.get_origin(tp) is not list:
        return None
    if tp == list[int]:
        return "q"
    if tp == list[float] and finite:  # `_numbers` refuses inf and nan
        return "d"
    return None


def _struct(
    model: type[BaseModel], tag_field: str | None, packed: dict[str, str] | None
) -> tuple[type[msgspec.Struct], list[Pack], list[tuple[str, Check]], list[Callable[[Any], Any]]]:
    """The Struct for `model`, its packed fields, its per-field checks and its after-validators.
    `packed`: the fields `_numbers.split` reads for the decoder so far (name -> array typecode, or
    "plain"; in `split` order), added to here."""
    decorators = model.__pydantic_decorators__
    if decorators.field_validators or decorators.root_validators or decorators.validators:
        raise Unsupported(f"{model.__name__}: field validators")
    after = []
    for dec in decorators.model_validators.values():
        if dec.info.mode != "after":
            raise Unsupported(f"{model.__name__}: a {dec.info.mode} model validator")
        after.append(dec.func)
    config = model.model_config
    if not _CONFIG.issuperset(config):
        raise Unsupported(f"{model.__name__}: model settings {sorted(set(config) - _CONFIG)}")
    finite = not config.get("allow_inf_nan", True)
    tag = _tag(model, tag_field)
    fields: list[Any] = []
    packs: list[Pack] = []
    checks: list[tuple[str, Check]] = []
    for name, info in model.model_fields.items():
        if name == tag_field:
            continue
        where = f"{model.__name__}.{name}"
        if info.alias not in (None, name) or info.validation_alias not in (None, name):
            raise Unsupported(f"{where}: an alias")
        tp, check = _translate(info.annotation, where, finite)
        if packed is not None and info.is_required() and not info.metadata:
            typecode = _packing(info.annotation, finite)
            if typecode is not None and packed.setdefault(name, typecode) == typecode:
                packs.append((name, list(packed).index(name), typecode))
                tp, check = None, None  # `_numbers.split` read it and left nil in its place
        if packed is not None and _numbers is not None and check is _plain:
            if packed.setdefault(name, "plain") == "plain":
                check = None  # `_numbers.split` checks it on its walk over the payload
        meta = _meta(info.metadata, where)
        if meta is not None:
            tp = Annotated[tp, meta]
        if check is not None:
            checks.append((name, check))
        if name == "v" or info.is_required():  # `v`: the codec refuses a record without it
            fields.append((name, tp))
        elif info.default_factory is not None:
            fields.append((name, tp, msgspec.field(default_factory=info.default_factory)))  # type: ignore[arg-type]
        else:
            fields.append((name, tp, info.default))
    struct = msgspec.defstruct(
        f"Fast{model.__name__}",
        fields,
        kw_only=True,  # the model's field order, whichever have defaults
        forbid_unknown_fields=config.get("extra") == "forbid",
        tag_field=tag_field,
        tag=tag,
        # `ev.kind` as on the model; `__model__` for `model_of`
        namespace={"__model__": model, **({tag_field: tag} if tag_field else {})},
        gc=False,  # decoded records hold no reference cycles: the collector need not track them
    )
    return struct, packs, checks, after


class FastDecoder:
    """Decodes msgpack into Structs generated from one model, or a tagged union of models;
    `packed`: numbers in arrays (see the module doc)."""

    def __init__(
        self, models: list[type[BaseModel]], tag_field: str | None = None, packed: bool = False
    ) -> None:
        self._post: dict[type, tuple[list[Pack], list[tuple[str, Check]], list[Callable[[Any], Any]]]] = {}
        """Per Struct: its packed fields, its checks, its after-validators (what `decode` does next)."""
        numbers: dict[str, str] | None = {} if packed else None
        structs = []
        for model in models:
            struct, packs, checks, after = _struct(model, tag_field, numbers)
            self._post[struct] = packs, checks, after
            structs.append(struct)
        self._split = tuple((name.encode(), _SPLIT_KINDS[code]) for name, code in (numbers or {}).items())
        """The fields `_numbers.split` reads, (name, kind) each; () when nothing is packed."""
        if self._split:
            _INT64.update(structs)
        target = structs[0] if len(structs) == 1 else Union[tuple(structs)]  # noqa: UP007 (built at run time)
        self._decoder = msgspec.msgpack.Decoder(target)

    @classmethod
    def for_model(cls, model: Any, packed: bool = False) -> FastDecoder | None:
        """A decoder for a model or a discriminated union of models (`Event`); None if unsupported."""
        try:
            if typing.get_origin(model) is Annotated:
                union, field = typing.get_args(model)
                return cls(list(typing.get_args(union)), tag_field=field.discriminator, packed=packed)
            return cls([model], packed=packed)
        except Unsupported:
            return None

    def decode(self, data: bytes) -> Any | None:
        """The decoded record, or None: not surely valid, so for the codec to decide."""
        numbers: tuple[bytes | None, ...] = ()
        if self._split:
            parts = _numbers.split(data, self._split)
            if parts is None:  # numbers that are not plainly numbers, or broken msgpack
                return None
            data, numbers = parts
        try:
            record = self._decoder.decode(data)
        except msgspec.DecodeError:  # ValidationError included
            return None
        if record.v not in SUPPORTED_VERSIONS:
            return None
        packs, checks, after = self._post[type(record)]
        for name, index, typecode in packs:
            values = numbers[index]
            if values is None:  # the field was absent: msgspec would have said so; to be sure
                return None
            setattr(record, name, array(typecode, values))
        for name, check in checks:
            if not check(getattr(record, name)):
                return None
        for validator in after:
            try:
                if validator(record) is not record:  # it would have changed the record: codec's
                    return None
            except (ValueError, AssertionError):
                return None
        return record


_INT64: set[type] = set()
"""The Structs whose payloads `_numbers.split` walks whole: every int in them fits int64."""


def ints_checked(record: Any) -> bool:
    """True if every int of `record` fits int64: decoded by a `packed` decoder whose `_numbers.split`
    walked the whole payload (so `tables.check_ints` need not check their range again)."""
    return type(record) in _INT64


def fields(record: Any) -> dict[str, Any]:
    """The field values of a record, decoded here or a pydantic model, as a new dict (a model's
    `__dict__`; for a Struct the same keys and values, its tag included)."""
    if not isinstance(record, msgspec.Struct):
        return dict(record.__dict__)
    out = msgspec.structs.asdict(record)
    config = record.__struct_config__
    if config.tag_field is not None:
        out[config.tag_field] = config.tag
    return out


def model_of(record: Any) -> type[BaseModel]:
    """The pydantic model of a record, decoded here or a model instance."""
    return getattr(type(record), "__model__", type(record))
