"""Byte sizes as options take them (``512MiB``, ``2GiB``, ``1.5GB``, ``4096``) and as messages print them;
`diskflow.sizes` is their public face."""
from __future__ import annotations

from ...errors import ConfigError

__all__ = ["format_bytes", "parse_bytes"]


def parse_bytes(value: str | float, option: str = "size") -> int:
    """A byte size such as `512MiB`, `2GiB`, `1.5GB` or `4096` (Dask's own parser); errors name the option."""
    from dask.utils import parse_bytes as dask_parse_bytes

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(option, f"not a byte size: {value!r} (use e.g. 512MiB, 2GiB, 1.5GB)")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(option, f"must be >= 0, got {value}")
        return int(value)
    try:
        if not value.strip() or not value.strip()[0].isdigit() and value.strip()[0] not in ".-":
            raise ValueError(value)         # Dask reads a bare unit ("MiB") as one of it
        n = dask_parse_bytes(value.strip())
    except (ValueError, TypeError):
        raise ConfigError(option, f"not a byte size: {value!r} (use e.g. 512MiB, 2GiB, 1.5GB)") from None
    if n < 0:
        raise ConfigError(option, f"must be >= 0, got {value}")
    return int(n)


def format_bytes(n: float) -> str:
    """Human-readable binary size."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"
