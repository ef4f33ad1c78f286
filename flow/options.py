"""argparse value parsers that fail with a message naming the option and the fault."""
from __future__ import annotations

import argparse
from collections.abc import Callable

from ..operators.formats.errors import ConfigError
from ..operators.formats.files import parse_bytes


def positive_int(option: str) -> Callable[[str], int]:
    """Parser for an integer >= 1."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option}: expected an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{option}: must be >= 1, got {value}")
        return value
    return parse


def fanouts_option(option: str = "--fanouts") -> Callable[[str], tuple[int, ...]]:
    """Parser for per-hop fanouts such as `10,15,20` (-1 = all neighbours)."""
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(t) for t in text.split(",") if t.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option}: expected comma-separated integers >= -1, got {text!r}") from None
        if not values or any(v < -1 for v in values):
            raise argparse.ArgumentTypeError(f"{option}: expected comma-separated integers >= -1, got {text!r}")
        return values
    return parse


def byte_size(option: str) -> Callable[[str], int]:
    """Parser for sizes such as `2GiB`, `512MiB`, `1.5GB`."""
    def parse(text: str) -> int:
        try:
            return parse_bytes(text, option)
        except ConfigError as e:  # -> argparse's own message format
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def byte_budget(value: int | str | None, option: str, whole: int) -> int | None:
    """Bytes from an int, ``"2GiB"``, or a share of `whole` such as ``"10%"``; None stays None."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100
        except ValueError:
            raise ConfigError(option, f"not a percentage: {value!r}") from None
        if share < 0:
            raise ConfigError(option, f"must be >= 0, got {value!r}")
        return int(whole * share)
    return parse_bytes(value, option)


def parse_int(option: str, text: str, minimum: int) -> int:
    """An integer option >= minimum, or a ConfigError naming the option."""
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(option, f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise ConfigError(option, f"expected an integer >= {minimum}, got {text!r}")
    return value
