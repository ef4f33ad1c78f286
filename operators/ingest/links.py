"""Link prediction at ingest: the split of every edge and the store's link arrays (docs/design.md, "Formats").

Seed edges for link prediction come from a ``split`` column of the raw ``edges/`` tables ("train",
"val", "test") or from a seeded random split with PyG's ``RandomLinkSplit`` semantics. Every edge gets a
tag while it is scanned: `TAG_MP` (a training edge that message passing sees), `TAG_SUPERVISION` (a
training edge held out of message passing, PyG's ``disjoint_train_ratio``), `TAG_VAL` or `TAG_TEST`. Only
`TAG_MP` edges enter the CSC topology, so no validation or test edge (nor, under to_undirected, its
reverse) is in the graph that training samples from.

The random split needs no E-sized permutation: an edge's split is a seeded hash of its (src, dst) pair
(of (min, max) under to_undirected, so both directions of an edge share a split, and so do repeated
edges) against the shares. Counts are therefore binomial around the shares rather than exact as in
``RandomLinkSplit``. The supervision share of the training edges is drawn the same way with another salt.

Per split the store holds ``link/{split}.npy`` (int64 [2, P]: row 0 src, row 1 dst, one column per raw
edge of that split, in raw order: files by path, rows in file order) and for val and test
``link/{split}_neg.npy`` (int64 [P, K]): K negative destinations per positive, drawn uniformly over all
nodes (excluding nothing, so a negative may by chance be a true edge, as with OGB's sampled negatives)
from a generator seeded by (seed, split, block), blocks of `NEGATIVE_BLOCK` positives, so the negatives
depend on the seed alone. ``link/train.npy`` holds the training supervision edges: every training edge
when ``disjoint_train_ratio`` is 0, else just the held-out share.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError
from ..formats.npyio import npy_header
from ..formats.storecheck import Piece, add_pieces

__all__ = ["LINK_SPLITS", "NEGATIVE_BLOCK", "TAG_MP", "TAG_SPLIT", "TAG_SUPERVISION", "TAG_TEST", "TAG_VAL",
           "LinkConfig", "LinkPiece", "link_tags", "pair_uniform", "supervision_tag", "write_link_arrays"]

LINK_SPLITS = ("train", "val", "test")
TAG_MP, TAG_SUPERVISION, TAG_VAL, TAG_TEST = 0, 1, 2, 3
TAG_SPLIT = ("train", "train", "val", "test")   # the split each tag belongs to
NEGATIVE_BLOCK = 1 << 16    # positives per negatives draw: fixed, so the negatives do not depend on the budget
_SPLIT_SALT, _DISJOINT_SALT = 0x5EED_0001, 0x5EED_0002
_M64 = (1 << 64) - 1


@dataclass(frozen=True)
class LinkConfig:
    """The link-prediction options of an ingest.

    Attributes:
        split: (val, test) shares of a seeded random split; None takes the split from the raw edges'
            ``split`` column (and without one there is no link split).
        disjoint_train_ratio: share of the training edges held out of message passing as supervision
            edges only (PyG's ``disjoint_train_ratio``).
        negatives: K, the fixed negatives per validation and test positive (MRR, Hits@K).
        seed: seeds the random split, the supervision share and the negatives.
    """

    split: tuple[float, ...] | None = None      # (val, test); check() refuses another length
    disjoint_train_ratio: float = 0.0
    negatives: int = 100
    seed: int = 0

    def check(self) -> LinkConfig:
        """This config, its ranges checked (a ConfigError naming the option)."""
        if self.split is not None:
            if len(self.split) != 2:
                raise ConfigError("link_split", f"expected two shares (val, test), got {self.split!r}")
            val, test = (float(s) for s in self.split)
            if not all(math.isfinite(s) and 0.0 <= s < 1.0 for s in (val, test)) or val + test >= 1.0:
                raise ConfigError("link_split", f"expected shares val, test >= 0 with val + test < 1, "
                                                f"got {val:g},{test:g}")
        r = float(self.disjoint_train_ratio)
        if not (math.isfinite(r) and 0.0 <= r < 1.0):
            raise ConfigError("disjoint_train_ratio", f"expected a share in [0, 1), got {self.disjoint_train_ratio!r}")
        if int(self.negatives) < 1:
            raise ConfigError("link_negatives", f"expected an integer >= 1, got {self.negatives!r}")
        if not 0 <= int(self.seed) <= _M64:
            raise ConfigError("link_seed", f"expected an integer in 0..2**64-1, got {self.seed!r}")
        return self

    def as_config(self) -> dict[str, Any]:
        """The options as the store's ``config`` records them."""
        return {"link_split": None if self.split is None else [float(s) for s in self.split],
                "disjoint_train_ratio": float(self.disjoint_train_ratio), "link_negatives": int(self.negatives),
                "link_seed": int(self.seed)}

    def describe(self, source: str, counts: dict[str, int], undirected: bool) -> dict[str, Any]:
        """The manifest's ``link`` entry."""
        val, test = (None, None) if self.split is None else (float(self.split[0]), float(self.split[1]))
        return {"source": source, "val": val, "test": test, "disjoint_train_ratio": float(self.disjoint_train_ratio),
                "seed": int(self.seed), "negatives": int(self.negatives), "counts": dict(counts),
                "undirected": bool(undirected),
                "files": {"train": "link/train.npy", "val": "link/val.npy", "test": "link/test.npy",
                          "val_neg": "link/val_neg.npy", "test_neg": "link/test_neg.npy"}}


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (wrapping arithmetic)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def pair_uniform(a: np.ndarray, b: np.ndarray, seed: int, salt: int) -> np.ndarray:
    """A uniform number in [0, 1) per (a, b) pair: a seeded hash, the same for the same pair on any machine."""
    key = np.full(1, (int(seed) * 0x9E3779B97F4A7C15 + salt) & _M64, np.uint64)
    h = _mix(np.asarray(a, np.int64).view(np.uint64) ^ _mix(key)[0])
    h = _mix(h ^ np.asarray(b, np.int64).view(np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _pair(src: np.ndarray, dst: np.ndarray, undirected: bool) -> tuple[np.ndarray, np.ndarray]:
    return (np.minimum(src, dst), np.maximum(src, dst)) if undirected else (src, dst)


def supervision_tag(src: np.ndarray, dst: np.ndarray, tags: np.ndarray, cfg: LinkConfig, undirected: bool) -> None:
    """Turn the `disjoint_train_ratio` share of the training edges (`TAG_MP`) into `TAG_SUPERVISION`, in place."""
    if cfg.disjoint_train_ratio <= 0:
        return
    a, b = _pair(src, dst, undirected)
    held = (tags == TAG_MP) & (pair_uniform(a, b, cfg.seed, _DISJOINT_SALT) < cfg.disjoint_train_ratio)
    tags[held] = TAG_SUPERVISION


def link_tags(src: np.ndarray, dst: np.ndarray, codes: np.ndarray | None, cfg: LinkConfig,
              undirected: bool) -> np.ndarray:
    """The tag (`TAG_*`, uint8) of each edge: from split `codes` (0 train, 1 val, 2 test: the ``split`` column)
    or, when `codes` is None, from the seeded random split of `cfg`; then the supervision share."""
    if codes is None:
        if cfg.split is None:
            raise ConfigError("link_split", "no split column and no link_split shares")
        val, test = float(cfg.split[0]), float(cfg.split[1])
        u = pair_uniform(*_pair(src, dst, undirected), cfg.seed, _SPLIT_SALT)
        tags = np.full(len(src), TAG_MP, np.uint8)
        tags[u < val + test] = TAG_VAL
        tags[u < test] = TAG_TEST
    else:
        tags = np.asarray(codes, np.uint8) + np.uint8(1)
        tags[tags == 1] = TAG_MP
    supervision_tag(src, dst, tags, cfg, undirected)
    return tags


@dataclass(frozen=True)
class LinkPiece:
    """The supervision edges of one split that one edge scan found: `count` int64 (src, dst) pairs in `path`."""

    split: str
    path: str
    count: int


def _create(out: Path, shape: tuple[int, int], crc: list[Piece] | None, rel: str) -> tuple[np.ndarray, int]:
    """A zero-filled int64 .npy of `shape` at `out` (as ``np.lib.format.open_memmap`` makes it), writable through
    the returned map, and its header's length; the header's crc32 pieces go to `crc` (as store file `rel`)."""
    header = npy_header(np.dtype(np.int64), shape)
    nbytes = shape[0] * shape[1] * 8
    with open(out, "wb") as f:
        f.write(header)
        f.truncate(len(header) + nbytes)
    add_pieces(crc, rel, 0, np.frombuffer(header, np.uint8))
    if nbytes == 0:
        return np.zeros(shape, np.int64), len(header)
    return np.memmap(out, np.int64, "r+", offset=len(header), shape=shape), len(header)


def _copy_pieces(found: Sequence[LinkPiece], out: Path, block: int, crc: list[Piece] | None, rel: str) -> int:
    """Write the pieces' pairs, in order, as an int64 [2, P] .npy at `out` (a block at a time); the crc32
    pieces of what is written go to `crc`."""
    total = sum(p.count for p in found)
    arr, head = _create(out, (2, total), crc, rel)
    pos = 0
    for p in found:
        for a in range(0, p.count, block):
            n = min(block, p.count - a)
            pairs = np.fromfile(p.path, np.int64, count=2 * n, offset=16 * a).reshape(n, 2)
            for row in (0, 1):          # row 0 the sources, row 1 the destinations: two runs of the file
                values = np.ascontiguousarray(pairs[:, row])
                arr[row, pos:pos + n] = values
                add_pieces(crc, rel, head + (row * total + pos) * 8, values)
            pos += n
    if isinstance(arr, np.memmap):
        arr.flush()
    del arr
    return total


def _write_negatives(out: Path, count: int, num_nodes: int, k: int, seed: int, split_code: int,
                     crc: list[Piece] | None, rel: str) -> None:
    """K uniform negative destinations per positive, int64 [count, k], drawn per `NEGATIVE_BLOCK` positives;
    the crc32 pieces of what is written go to `crc`."""
    arr, head = _create(out, (count, k), crc, rel)
    for b, a in enumerate(range(0, count, NEGATIVE_BLOCK)):
        n = min(NEGATIVE_BLOCK, count - a)
        draws = np.random.default_rng([int(seed), split_code, b]).integers(0, num_nodes, (n, k), dtype=np.int64)
        arr[a:a + n] = draws
        add_pieces(crc, rel, head + a * k * 8, draws)
    if isinstance(arr, np.memmap):
        arr.flush()
    del arr


def write_link_arrays(found: Sequence[Sequence[LinkPiece]], out_dir: str | os.PathLike[str], *, num_nodes: int,
                      cfg: LinkConfig, block: int = 1 << 20, pieces: list[Piece] | None = None) -> dict[str, int]:
    """Write ``link/{train,val,test}.npy`` and ``link/{val,test}_neg.npy`` into `out_dir` (the store's ``link/``)
    from every edge scan's `found` pairs (in file order); the count of each split. `pieces`: where given, the
    crc32 pieces of the bytes written are appended to it as they are written (store files named
    ``<out_dir's name>/<file>``: `storecheck.add_pieces`)."""
    out = Path(out_dir)
    counts = {}
    for code, split in enumerate(LINK_SPLITS):
        mine = [p for file_pieces in found for p in file_pieces if p.split == split]
        counts[split] = _copy_pieces(mine, out / f"{split}.npy", max(1, block), pieces, f"{out.name}/{split}.npy")
        if split != "train":
            _write_negatives(out / f"{split}_neg.npy", counts[split], num_nodes, int(cfg.negatives), cfg.seed, code,
                             pieces, f"{out.name}/{split}_neg.npy")
    return counts
