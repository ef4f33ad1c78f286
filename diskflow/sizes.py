"""Byte sizes as the commands and the API take them: ``"512MiB"``, ``"2GiB"``, a share of a whole (``"10%"``).

    from diskflow.sizes import byte_budget, format_bytes, parse_bytes

    parse_bytes("2GiB")                       # 2147483648
    byte_budget("10%", "cpu_memory", 10**9)   # 100000000
    format_bytes(3 << 30)                     # '3.00 GiB'
"""
from __future__ import annotations

from .flow.options import byte_budget as _byte_budget
from .operators.formats.sizes import format_bytes as _format_bytes
from .operators.formats.sizes import parse_bytes as _parse_bytes

__all__ = ["byte_budget", "format_bytes", "parse_bytes"]


def parse_bytes(value: str | float, option: str = "size") -> int:
    """Bytes from ``"512MiB"``, ``"1.5GB"``, ``"4096"`` or a number, so that every size option reads alike.

    Raises:
        ConfigError: naming `option`, for anything that is not a size >= 0.
    """
    return _parse_bytes(value, option)


def format_bytes(n: float) -> str:
    """`n` bytes for people (``"1.50 GiB"``): how every command prints sizes."""
    return _format_bytes(n)


def byte_budget(value: int | str | None, option: str, whole: int) -> int | None:
    """A budget in bytes from an int, ``"2GiB"`` or a share of `whole` (``"10%"``; `whole` is usually the
    feature bytes), so budgets can be given relative to the data; None stays None.

    Raises:
        ConfigError: naming `option`, for a size or share that does not parse or is negative.
    """
    return _byte_budget(value, option, whole)
