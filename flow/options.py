"""argparse value parsers that fail with a message naming the option and the fault."""
from __future__ import annotations

import argparse
from typing import Callable

from ..operators.files import parse_bytes


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
        except Exception as e:  # ConfigError -> argparse message
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse
