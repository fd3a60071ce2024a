"""``ServerArgs``: the one flat, immutable record every later stage reads.

It is generated from the namespace classes in ``fields/``: one attribute per field, in the
frozen positional order, each remembering its namespace.  A resolved record also carries
what the user gave (``raw_input``), which fields were set explicitly, and the rewrites the
resolution rules made, so nothing about how a value came to be is lost.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from types import MappingProxyType
from typing import Any, Dict, FrozenSet, Iterator, List, Mapping, Tuple

from .field_order import POSITIONAL_FIELD_ORDER
from .fields import NAMESPACES
from .spec import Arg, arg_of


_IMMUTABLE = (bool, int, float, str, tuple, frozenset)


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    name: str
    namespace: str
    type: Any
    default: Any
    default_factory: Any
    arg: Arg

    def default_value(self) -> Any:
        if self.default_factory is not dataclasses.MISSING:
            return self.default_factory()
        d = self.default
        if d is None or type(d) in _IMMUTABLE:
            return d  # most of the 561 defaults: no copy needed
        return copy.deepcopy(d)

    @property
    def key(self) -> str:
        """Dotted Hydra key, e.g. ``memory.hicache_ratio``."""
        return f"{self.namespace}.{self.name}"


def collect_fields() -> Dict[str, FieldInfo]:
    """All namespace fields in record order; a name declared twice is a bug."""
    collected: Dict[str, FieldInfo] = {}
    for ns, cls in NAMESPACES.items():
        hints = _type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in collected:
                raise ValueError(
                    f"{f.name!r} is declared by both {NAMESPACES[collected[f.name].namespace].__name__} "
                    f"and {cls.__name__}; a field belongs to exactly one namespace")
            collected[f.name] = FieldInfo(f.name, ns, hints[f.name], _as_declared_type(hints[f.name], f.default),
                                          f.default_factory, arg_of(f))
    # The reference's positional order first (our frozen order names a subset of it in the
    # same relative order), then this project's own fields (KV geometry) in collection order.
    from .schema_snapshot import reference_fields
    ordered = {n: collected[n] for n in POSITIONAL_FIELD_ORDER if n in collected}
    ref_order = [n for n in reference_fields() if n in collected]
    if [n for n in ref_order if n in ordered] == list(ordered):
        ordered = {n: collected[n] for n in ref_order}
    ordered.update((n, fi) for n, fi in collected.items() if n not in ordered)
    return ordered


def _as_declared_type(tp: Any, default: Any) -> Any:
    """A whole-number default of a float field as a float (``watchdog_timeout: 300.0``).

    Every value given for such a field is coerced to float, so an int default would print as
    ``300`` in a resolved record and read back as ``300.0``: the record would not round-trip."""
    import typing
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is typing.Union else [tp]
    if args == [float] and type(default) is int:
        return float(default)
    return default


def _type_hints(cls) -> Dict[str, Any]:
    import typing
    return typing.get_type_hints(cls)


FIELDS: Mapping[str, FieldInfo] = MappingProxyType(collect_fields())


def _build_record_class():
    specs = []
    for fi in FIELDS.values():
        if fi.default_factory is not dataclasses.MISSING:
            specs.append((fi.name, fi.type, dataclasses.field(default_factory=fi.default_factory)))
        else:
            specs.append((fi.name, fi.type, dataclasses.field(default=fi.default)))
    from .fastclass import fast_dataclass
    return fast_dataclass("ServerArgs", specs, frozen=True, module=__name__, namespace={
        "__doc__": "The flat server record: every field of every namespace, in record order.",
        "__reduce__": _reduce,
        "raw_input": property(lambda self: MappingProxyType(self.__dict__.get("_raw_input", {}))),
        "explicit_fields": property(lambda self: self.__dict__.get("_explicit", frozenset())),
        "resolution_log": property(lambda self: self.__dict__.get("_log", ())),
        "is_explicit": lambda self, name: name in self.__dict__.get("_explicit", frozenset()),
        "to_dict": lambda self: {f: getattr(self, f) for f in FIELDS},
        "_NS_BY_FIELD": MappingProxyType({n: fi.namespace for n, fi in FIELDS.items()}),
    })


def _reduce(self):
    bookkeeping = {k: v for k, v in self.__dict__.items() if k not in FIELDS}
    return (_rebuild, (self.to_dict(), bookkeeping))


def _rebuild(values, bookkeeping):
    rec = ServerArgs(**values)
    rec.__dict__.update(bookkeeping)
    return rec


ServerArgs = _build_record_class()


def finalize(values: Dict[str, Any], *, raw: Mapping[str, Any], explicit: FrozenSet[str],
             log: Tuple[Tuple[str, str, Any, Any], ...]) -> "ServerArgs":
    """Freeze resolved values into a record that remembers its provenance."""
    rec = ServerArgs(**values)
    d = rec.__dict__
    d["_raw_input"] = dict(raw)
    d["_explicit"] = frozenset(explicit)
    d["_log"] = tuple(log)
    return rec


@functools.lru_cache(maxsize=None)
def _namespace_map(cls) -> Mapping[str, str]:
    return MappingProxyType(dict(getattr(cls, "_NS_BY_FIELD", {})))


def namespace_of(cls_or_record) -> Dict[str, str]:
    """``{field: namespace}`` for the record class (or a record); ``{}`` for other types."""
    cls = cls_or_record if isinstance(cls_or_record, type) else type(cls_or_record)
    return dict(_namespace_map(cls))


class NamespaceView:
    """Read-only view of one namespace of a record: ``get_memory(rec).hicache_ratio``."""

    __slots__ = ("_record", "_namespace", "_names")

    def __init__(self, record, namespace: str):
        names = tuple(n for n, ns in record._NS_BY_FIELD.items() if ns == namespace)
        if not names:
            raise ValueError(f"config namespace {namespace!r} does not exist")
        object.__setattr__(self, "_record", record)
        object.__setattr__(self, "_namespace", namespace)
        object.__setattr__(self, "_names", names)

    def __getattr__(self, name: str) -> Any:
        if name in self._names:
            return getattr(self._record, name)
        raise AttributeError(f"config namespace {self._namespace!r} has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"config namespace {self._namespace!r} is read-only; build a new record instead")

    def __contains__(self, name: str) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def to_dict(self) -> Dict[str, Any]:
        return {n: getattr(self._record, n) for n in self._names}

    def __repr__(self) -> str:
        return f"{self._namespace}({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


def get_namespace(record, namespace: str) -> NamespaceView:
    return NamespaceView(record, namespace)


def get_model(record): return NamespaceView(record, "model")
def get_memory(record): return NamespaceView(record, "memory")
def get_disagg(record): return NamespaceView(record, "disagg")
def get_schedule(record): return NamespaceView(record, "schedule")
def get_parallel(record): return NamespaceView(record, "parallel")
def get_device(record): return NamespaceView(record, "device")
def get_spec(record): return NamespaceView(record, "spec")
def get_serving(record): return NamespaceView(record, "serving")


def fields_of_namespace(namespace: str) -> List[FieldInfo]:
    return [fi for fi in FIELDS.values() if fi.namespace == namespace]
