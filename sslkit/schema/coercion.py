"""A recipe's value against the type its field declares: the one type check of recipe values.

The sections' fields (:mod:`sslkit.schema.sections`), every method's ``method.*`` options
(:func:`sslkit.methods.check_config`) and every loss's ``loss.*`` arguments
(:func:`sslkit.losses.check_loss_kwargs`) are checked by :func:`coerce`, so a value is accepted or
refused, and the error reads, the same whichever section it is in.

>>> coerce("1e-3", float, "optim.lr", "recipe")  # YAML 1.1 reads 1e-3 as a string
0.001
"""

from __future__ import annotations

import types
import typing
from typing import Any

from sslkit.errors import UserError


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_NO_IS_A_CHOICE = {"train.mixed_precision"}  # string keys with a choice spelled "no"


def coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check ``value`` against the annotation ``tp``; int is accepted for float, lists for tuples."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, key, source)
            except UserError:
                pass
        raise UserError(f"{source}: '{key}' must be {' or '.join(_type_name(o) for o in options)}, got {value!r}")
    if origin in (tuple, list):
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{source}: '{key}' must be a list, got {value!r}")
        if origin is tuple and len(args) != len(value):
            raise UserError(f"{source}: '{key}' must be a list of {len(args)} values, got {value!r}")
        items = [coerce(v, args[i] if origin is tuple else args[0], key, source) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{source}: '{key}' must be a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        # YAML 1.1 reads 1e-3 (no dot) as a string; every user writes it that way.
        try:
            return float(value)
        except ValueError:
            pass
    if tp is bool and isinstance(value, bool):
        return value
    if tp in (int, str) and isinstance(value, tp) and not isinstance(value, bool):
        return value
    if tp is str and value is False and key in _NO_IS_A_CHOICE:
        return "no"  # YAML 1.1 reads an unquoted no as false: `mixed_precision: no` means the choice "no"
    raise UserError(f"{source}: '{key}' must be {_type_name(tp)}, got {value!r}")
