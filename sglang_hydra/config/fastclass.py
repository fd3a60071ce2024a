"""Dataclasses with hundreds of fields, built without generating code.

``dataclasses.make_dataclass`` writes and compiles an ``__init__``/``__repr__``/``__eq__``
per class; for the 561-field record and its namespaces that costs about half a second at
every start.  :func:`fast_dataclass` builds a class that ``dataclasses.fields``,
``dataclasses.is_dataclass``, ``dataclasses.replace`` and OmegaConf accept the same way,
with one shared ``__init__`` that loops over the fields instead.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, Optional, Tuple

_MISSING = dataclasses.MISSING


def _prepare(specs: Iterable[Tuple[str, Any, dataclasses.Field]]) -> Dict[str, dataclasses.Field]:
    out: Dict[str, dataclasses.Field] = {}
    for name, tp, f in specs:
        if not isinstance(f, dataclasses.Field):
            f = dataclasses.field(default=f)
        f.name = name
        f.type = tp
        f._field_type = dataclasses._FIELD  # what dataclasses.fields() filters on
        out[name] = f
    return out


def _make_init(names: Tuple[str, ...], defaults: Dict[str, Any], factories: Dict[str, Any], frozen: bool):
    setter = object.__setattr__
    known = frozenset(names)

    def __init__(self, *args, **kwargs):
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}() takes {len(names)} positional arguments but {len(args)} were given")
        for name, value in zip(names, args):
            if name in kwargs:
                raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
            kwargs[name] = value
        unknown = kwargs.keys() - known
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword arguments {sorted(unknown)}")
        d = self.__dict__
        for name in names:
            if name in kwargs:
                d[name] = kwargs[name]
            elif name in factories:
                d[name] = factories[name]()
            elif name in defaults:
                d[name] = defaults[name]
            else:
                raise TypeError(f"{type(self).__name__}() missing required argument {name!r}")
        post = getattr(self, "__post_init__", None)
        if post is not None:
            post()

    del setter
    return __init__


def fast_dataclass(cls_name: str, specs, *, frozen: bool = False, namespace: Optional[Dict[str, Any]] = None,
                   module: Optional[str] = None) -> type:
    fields = _prepare(specs)
    names = tuple(fields)
    defaults = {n: f.default for n, f in fields.items() if f.default is not _MISSING}
    factories = {n: f.default_factory for n, f in fields.items() if f.default_factory is not _MISSING}

    def __repr__(self):
        return f"{type(self).__name__}(" + ", ".join(f"{n}={self.__dict__.get(n)!r}" for n in names) + ")"

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        a, b = self.__dict__, other.__dict__
        return all(a.get(n) == b.get(n) for n in names)

    body: Dict[str, Any] = {
        "__init__": _make_init(names, defaults, factories, frozen),
        "__repr__": __repr__,
        "__eq__": __eq__,
        "__dataclass_fields__": fields,
        "__dataclass_params__": dataclasses._DataclassParams(True, True, True, False, False, frozen),
        "__annotations__": {n: f.type for n, f in fields.items()},
        "__match_args__": names,
    }
    # Class attributes hold the defaults, as a dataclass's do (OmegaConf reads them).
    for n, v in defaults.items():
        body[n] = v
    if frozen:
        def __setattr__(self, name, value):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

        def __delattr__(self, name):
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

        def __hash__(self):
            return hash(tuple(self.__dict__.get(n) for n in names))
        body.update(__setattr__=__setattr__, __delattr__=__delattr__, __hash__=__hash__)
    else:
        body["__hash__"] = None
    if namespace:
        body.update(namespace)
    cls = type(cls_name, (), body)
    if module:
        cls.__module__ = module
    return cls
