"""`NativeInt`: a wrapper's read-only integer attribute, read from its compiled object (``self._impl``)."""
from __future__ import annotations

from typing import Any, overload

__all__ = ["NativeInt"]


class NativeInt:
    """The attribute of the same name of the instance's compiled object, as a Python ``int``, read-only, with
    `doc` as its docstring: what a ``@property`` returning ``int(self._impl.<name>)`` does."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> NativeInt: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> int: ...

    def __get__(self, obj: Any, owner: type | None = None) -> NativeInt | int:
        if obj is None:
            return self
        return int(getattr(obj._impl, self.name))

    def __set__(self, obj: object, value: object) -> None:
        raise AttributeError(f"property {self.name!r} of {type(obj).__name__!r} object has no setter")
