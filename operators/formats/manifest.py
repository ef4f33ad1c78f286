"""A directory's manifest, `manifest.json`: written last, so a directory is a finished output only once
it has one (the files beside it were each renamed into place before: `atomic.atomic_path`), and read
to tell what a directory holds (its ``format``) and how it was made."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...errors import InputError
from .atomic import write_json

__all__ = ["MANIFEST", "read_manifest", "write_manifest"]

MANIFEST = "manifest.json"


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The directory's manifest, or None when it has none (i.e. it is not a finished output)."""
    p = Path(directory) / MANIFEST
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(p, f"unreadable manifest ({e})") from e


def write_manifest(directory: str | os.PathLike[str], manifest: dict[str, Any], durable: bool = True) -> None:
    """Write `manifest.json` last: from this moment the directory is a valid output.

    `durable=False` skips the fsync, for scratch outputs that never outlive the process using them.
    """
    write_json(Path(directory) / MANIFEST, manifest, durable)
