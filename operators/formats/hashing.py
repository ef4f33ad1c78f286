"""Hashes that decide whether work can be reused: a file's cheap content fingerprint (an input changed?)
and a config's stable hash (the same settings?). Neither is a checksum of data moved (`checksum`)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ...errors import InputError
from .atomic import json_default

__all__ = ["config_hash", "fingerprint"]

_FINGERPRINT_EDGE = 1 << 20  # bytes hashed at each end of a file for its fingerprint


def fingerprint(path: str | os.PathLike[str]) -> str:
    """A cheap content fingerprint: size, mtime and a hash of the first and last MiB.

    Hashing hundreds of GB on every re-run would cost as much as the work it saves;
    size + mtime + both ends catches rewrites, truncation and appends.
    """
    p = Path(path)
    try:
        st = p.stat()
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        with open(p, "rb") as f:
            h.update(f.read(_FINGERPRINT_EDGE))
            if st.st_size > 2 * _FINGERPRINT_EDGE:
                f.seek(-_FINGERPRINT_EDGE, os.SEEK_END)
                h.update(f.read(_FINGERPRINT_EDGE))
    except OSError as e:
        raise InputError(p, f"unreadable file ({e.strerror or e})") from e
    return h.hexdigest()


def config_hash(config: dict[str, Any]) -> str:
    """Stable hash of a JSON-able config dict."""
    blob = json.dumps(config, sort_keys=True, default=json_default).encode()
    return hashlib.blake2b(blob, digest_size=16).hexdigest()
