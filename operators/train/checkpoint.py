"""Training checkpoints: model, optimizer, RNG, position and the CPU tier, each one written atomically.

A checkpoint is a directory built under a temporary name and renamed into place, manifest
last, so a run killed at any moment (SIGKILL included) leaves either the previous checkpoint
or the new one, never a half-written one that looks valid::

    CHECKPOINTS/e{epoch:04d}-b{batch:06d}/
        state.pt        torch.save of a plain dict (model, optimizer, RNG states, records, ...)
        *.npy           arrays (the trainer's CPU tier rows and ids)
        manifest.json   written last: format, position, and bytes + crc32 of every file

The name is the position training resumes at: the next batch `batch` of epoch `epoch`
(``b000000`` at an epoch boundary). Older checkpoints are removed once a newer one is
complete. An array given as a path to an earlier checkpoint's file is hard-linked, not
rewritten (a mid-epoch checkpoint shares its epoch's CPU tier with the epoch-start one).
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import InputError
from ..formats.atomic import staging_dir
from ..formats.manifest import read_manifest, write_manifest
from ..formats.npyio import load_npy, save_npy
from ..formats.packed import file_crc

__all__ = ["FORMAT", "STATE", "VERSION", "Checkpoint", "checkpoint_name", "latest_checkpoint",
           "load_checkpoint", "save_checkpoint"]

FORMAT = "diskflow-checkpoint"
VERSION = 1
STATE = "state.pt"
_NAME = re.compile(r"e(\d{4,})-b(\d{6,})")


@dataclass
class Checkpoint:
    """A loaded, verified checkpoint."""

    path: Path
    epoch: int
    batch: int
    state: dict[str, Any]
    files: dict[str, dict[str, int]]

    def array(self, name: str) -> np.ndarray | None:
        """A saved array (memory-mapped), or None when the checkpoint has none of that name."""
        if name not in self.files:
            return None
        p = self.path / name
        try:
            return load_npy(p, "r")
        except (OSError, ValueError) as e:
            raise InputError(p, f"corrupt checkpoint array ({e})") from e

    def array_path(self, name: str) -> Path | None:
        """The file of a saved array (to link into a later checkpoint), or None."""
        return self.path / name if name in self.files else None


def checkpoint_name(epoch: int, batch: int) -> str:
    return f"e{epoch:04d}-b{batch:06d}"


def _position(d: Path) -> tuple[int, int] | None:
    m = _NAME.fullmatch(d.name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def save_checkpoint(root: str | os.PathLike[str], epoch: int, batch: int, state: dict[str, Any],
                    arrays: dict[str, np.ndarray | Path] | None = None) -> Path:
    """Write the checkpoint for position (`epoch`, `batch`) under `root`; remove older ones.

    Args:
        root: the checkpoints directory (created if missing).
        epoch, batch: where training resumes (next epoch, next batch within it).
        state: a dict of tensors, numbers, strings, lists and dicts (loadable with
            ``torch.load(weights_only=True)``).
        arrays: name (``*.npy``) -> array to save, or path of an existing saved array to hard-link.

    Returns:
        The checkpoint directory.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(epoch, batch)
    files: dict[str, dict[str, int]] = {}
    with staging_dir(final) as stage:
        torch.save(state, stage / STATE)
        for name, value in (arrays or {}).items():
            if not name.endswith(".npy") or "/" in name:
                raise ValueError(f"array names are plain *.npy file names, got {name!r}")
            if isinstance(value, Path):
                try:
                    os.link(value, stage / name)
                except OSError:
                    shutil.copyfile(value, stage / name)
            else:
                save_npy(stage / name, value)
        for p in sorted(stage.iterdir()):
            size = p.stat().st_size
            files[p.name] = {"bytes": size, "crc": file_crc(p, 0, size)}
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        write_manifest(stage, {"format": FORMAT, "version": VERSION, "epoch": int(epoch), "batch": int(batch),
                               "files": files})
    for d in root.iterdir():      # older checkpoints, and leftovers of interrupted saves
        pos = _position(d)
        if d != final and d.is_dir() and (d.name.startswith(".") or (pos is not None and pos < (epoch, batch))):
            shutil.rmtree(d, ignore_errors=True)
    return final


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint (manifest present) with the furthest position under `root`, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = [(pos, d) for d in root.iterdir() if (pos := _position(d)) is not None and (d / "manifest.json").is_file()]
    return max(done)[1] if done else None


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read and verify a checkpoint directory (sizes and crc32 of every file, then the state).

    Raises:
        InputError: naming the file, when the checkpoint is incomplete, corrupt or of another format.
    """
    p = Path(path)
    manifest = read_manifest(p)
    if manifest is None:
        raise InputError(p, "not a complete checkpoint (no manifest.json)")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise InputError(p / "manifest.json", f"not a diskflow checkpoint (format {manifest.get('format')!r}, "
                                              f"version {manifest.get('version')!r})")
    files = manifest.get("files") or {}
    if STATE not in files:
        raise InputError(p / "manifest.json", f"lists no {STATE}")
    for name, info in files.items():
        f = p / name
        try:
            size = f.stat().st_size
        except OSError as e:
            raise InputError(f, f"corrupt checkpoint: missing file ({e.strerror or e})") from e
        if size != int(info["bytes"]):
            raise InputError(f, f"corrupt checkpoint: {size} bytes, the manifest says {int(info['bytes'])}")
        if file_crc(f, 0, size) != int(info["crc"]):
            raise InputError(f, "corrupt checkpoint: checksum mismatch (delete the checkpoint to start over)")
    try:
        state = torch.load(p / STATE, map_location="cpu", weights_only=True)
    except Exception as e:  # any unpickling failure means a corrupt file
        raise InputError(p / STATE, f"corrupt checkpoint: cannot load the state ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict):
        raise InputError(p / STATE, "corrupt checkpoint: the state is not a dict")
    return Checkpoint(p, int(manifest["epoch"]), int(manifest["batch"]), state,
                      {k: {"bytes": int(v["bytes"]), "crc": int(v["crc"])} for k, v in files.items()})
