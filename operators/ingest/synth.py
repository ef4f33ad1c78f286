"""Synthetic graphs in the raw input format, generated one node range at a time.

The generator is built so that any task can produce its node range without a global table:

* **Popularity and communities.** A node's *rank* is a seeded bijection of its id,
  ``r(v) = (a*v + b) mod N``; its community is ``c(v) = r(v) mod C`` with C = num_classes.
  Community c holds the ranks c, c+C, c+2C, ...; member j of c is the node whose rank is
  ``j*C + c`` (the inverse bijection). Low ranks are popular, and because of the bijection
  the popular ("hot") nodes are scattered over the id range, as in real graphs.
* **Power-law degrees.** Each node draws an out-degree from a Pareto law with exponent
  ``degree_exponent`` (mean avg_degree/2); each edge picks a target community (its own with
  probability ``homophily``, else one of the others) and a member j = floor(m * u**s), a
  Zipf-like skew towards low ranks whose exponent makes in-degrees follow the same power
  law. Edges are written in both directions (the graph is undirected), with self-loops and
  duplicates inside a task removed, so the average stored degree is about ``avg_degree``.
* **Locality** (``locality``, default 0: none). Real graphs hold many small, dense clusters
  inside their big communities; the edges above have none (any two members of a community are
  equally likely to meet, but for popularity), so a min-cut partition finds nothing below the
  communities. With probability ``locality`` an edge that stays in its community goes instead to
  a member near its source's own member index (offset geometric with mean `LOCAL_WIDTH`, either
  side, wrapping): a ring of overlapping neighbourhoods in every community, which parts of a
  few thousand nodes can follow.
* **Labels** follow communities (label = community; a ``label_noise`` fraction gets a
  random class, decided by a hash of the node id so every task agrees). Inter-community
  edges always change community, so the edge homophily (same label at both ends) is about
  ``homophily`` when label_noise is 0; label noise lowers it.
* **Features** are a weak class signal plus Gaussian noise, ``signal * mu[c] + noise * z``
  with random unit-norm class centroids mu: an MLP on one node's features does poorly,
  while averaging a few neighbours (GraphSAGE) cancels the noise.

Everything is vectorised numpy and deterministic for (seed, part); memory is bounded by
the part size (features are generated and written in chunks).
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError
from ..formats.store import SPLITS
from .rawwriter import FEATURE_FORMATS, shard_name, write_edge_shard, write_feature_shard, write_node_shard

__all__ = ["FEATURE_CHUNK_ROWS", "LOCAL_WIDTH", "MAX_NODES", "OPTION", "Layout", "SynthConfig", "centroids",
           "labels_of", "synth_part"]

FEATURE_CHUNK_ROWS = 32_768  # features are generated and written this many rows at a time
LOCAL_WIDTH = 64             # locality: mean member offset of a local edge
MAX_NODES = 2**31 - 1        # keeps every rank product below 2**62 (int64 arithmetic)
# Random streams: part p uses default_rng([seed, p]); the global ones use tags no part
# index can reach (NumPy pads short seeds with zeros, so [seed, 1] == [seed, 1, 0]).
_TAG_LAYOUT = 2**62 + 1
_TAG_CENTROIDS = 2**62 + 2
_TAG_LABELS = 2**62 + 3

# What an error names for a field `diskflow.synth` takes under a shorter keyword (`nodes=`); the others by name.
OPTION = {"num_nodes": "nodes", "feature_dim": "dim", "num_classes": "classes"}


@dataclass(frozen=True)
class SynthConfig:
    """What to generate. Defaults give a 200k-node, 16-class graph where GraphSAGE beats an MLP by far
    without saturating: a weak class signal (0.8) and edges that leave their community 40% of the time.

    Until 2026-11-28 the defaults were ``signal=1.0, homophily=0.75``, a graph on which every pipeline
    scored about 0.96 (so an accuracy cost could not show); figures measured before then, and tests
    that pin losses, name those values.

    Attributes:
        num_nodes: N; node ids are 0..N-1.
        feature_dim: feature dimension.
        num_classes: classes (= communities).
        avg_degree: mean number of stored edges per node (both directions counted once each).
        homophily: probability that an edge stays inside its source's community.
        signal: length of the class centroid added to each feature row (class signal strength).
        noise: standard deviation of the per-dimension Gaussian noise.
        label_noise: fraction of nodes whose label is replaced by a random class.
        degree_exponent: gamma of the power law P(deg = d) ~ d**-gamma (> 2, so the mean exists).
        dtype: feature dtype, "float32" or "float16".
        seed: random seed (>= 0).
        train_frac, val_frac, test_frac: split fractions; the rest is split "none".
        part_nodes: nodes per task (memory per task scales with it, never with N).
        feature_format: "arrow" (Arrow IPC file) or "parquet" feature shards.
        locality: share of the within-community edges drawn to a member near the source (0: none).
    """

    num_nodes: int = 200_000
    feature_dim: int = 128
    num_classes: int = 16
    avg_degree: float = 15.0
    homophily: float = 0.6
    signal: float = 0.8
    noise: float = 1.0
    label_noise: float = 0.0
    degree_exponent: float = 2.5
    dtype: str = "float32"
    seed: int = 0
    train_frac: float = 0.6
    val_frac: float = 0.2
    test_frac: float = 0.2
    part_nodes: int = 250_000
    feature_format: str = "arrow"
    locality: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the option when a value is out of range."""
        def fail(name: str, fault: str) -> None:
            raise ConfigError(OPTION.get(name, name), f"{fault}, got {getattr(self, name)!r}")

        for f in fields(self):
            v = getattr(self, f.name)
            want_int = f.type in ("int", int)  # annotations are strings here
            if f.type in ("str", str):
                if not isinstance(v, str):
                    fail(f.name, "must be a string")
            elif isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                fail(f.name, "must be a number")
            elif want_int and not isinstance(v, (int, np.integer)):
                fail(f.name, "must be an integer")
            elif not want_int and not math.isfinite(float(v)):
                fail(f.name, "must be finite")
        if not 2 <= self.num_nodes <= MAX_NODES:
            fail("num_nodes", f"must be in [2, {MAX_NODES}]")
        if self.feature_dim < 1:
            fail("feature_dim", "must be >= 1")
        if not 2 <= self.num_classes <= self.num_nodes:
            fail("num_classes", "must be >= 2 and at most the number of nodes")
        if not 0 < self.avg_degree <= 2 * (self.num_nodes - 1):
            fail("avg_degree", "must be > 0 and at most 2*(nodes-1)")
        if not 0 <= self.homophily <= 1:
            fail("homophily", "must be in [0, 1]")
        if not 0 <= self.locality <= 1:
            fail("locality", "must be in [0, 1]")
        if self.signal < 0:
            fail("signal", "must be >= 0")
        if self.noise < 0:
            fail("noise", "must be >= 0")
        if not 0 <= self.label_noise <= 1:
            fail("label_noise", "must be in [0, 1]")
        if not 2 < self.degree_exponent <= 10:
            fail("degree_exponent", "must be in (2, 10]")
        if self.dtype not in ("float32", "float16"):
            fail("dtype", "must be float32 or float16")
        if self.seed < 0:
            fail("seed", "must be >= 0")
        for name in ("train_frac", "val_frac", "test_frac"):
            if not 0 <= getattr(self, name) <= 1:
                fail(name, "must be in [0, 1]")
        if self.train_frac + self.val_frac + self.test_frac > 1 + 1e-9:
            fail("test_frac", f"train + val + test fractions must be <= 1 "
                              f"({self.train_frac} + {self.val_frac} + {self.test_frac})")
        if self.part_nodes < 1:
            fail("part_nodes", "must be >= 1")
        if self.feature_format not in FEATURE_FORMATS:
            fail("feature_format", f"must be one of {', '.join(FEATURE_FORMATS)}")

    @property
    def num_parts(self) -> int:
        """Number of node ranges (tasks)."""
        return -(-self.num_nodes // self.part_nodes)

    def part_range(self, part: int) -> tuple[int, int]:
        """Node range [lo, hi) of task `part`."""
        if not 0 <= part < self.num_parts:
            raise ConfigError("part", f"must be in [0, {self.num_parts}), got {part}")
        lo = part * self.part_nodes
        return lo, min(lo + self.part_nodes, self.num_nodes)

    def as_dict(self) -> dict[str, Any]:
        """The config as a JSON-able dict (what the manifest records; `locality` only when set, so graphs
        made before it existed keep their identity)."""
        out = asdict(self)
        if not self.locality:
            out.pop("locality")
        return out


# ---------------------------------------------------------------------------- the id layout

@dataclass(frozen=True)
class Layout:
    """The seeded bijection between node ids and popularity ranks (and so communities)."""

    num_nodes: int
    num_communities: int
    a: int
    b: int
    a_inv: int

    @classmethod
    def of(cls, cfg: SynthConfig) -> Layout:
        """The layout for `cfg`: a seeded multiplier around 0.6*N coprime with N, and a seeded offset."""
        n = cfg.num_nodes
        rng = np.random.default_rng([cfg.seed, _TAG_LAYOUT])
        a = max(1, int(n * rng.uniform(0.55, 0.65))) | 1
        while math.gcd(a, n) != 1:  # a few steps at most: scalars, once per task
            a += 1
        return cls(n, cfg.num_classes, a % n if n > 1 else 0, int(rng.integers(0, n)), pow(a, -1, n))

    def rank(self, v: np.ndarray) -> np.ndarray:
        """Popularity rank of node ids `v` (0 = most popular)."""
        return (self.a * v + self.b) % self.num_nodes

    def community(self, v: np.ndarray) -> np.ndarray:
        """Community of node ids `v`."""
        return self.rank(v) % self.num_communities

    def members(self, c: np.ndarray) -> np.ndarray:
        """Number of nodes in communities `c`."""
        return (self.num_nodes - 1 - c) // self.num_communities + 1

    def node(self, c: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Node id of member `j` (0 = most popular) of community `c`."""
        r = j * self.num_communities + c
        return (self.a_inv * ((r - self.b) % self.num_nodes)) % self.num_nodes


def labels_of(cfg: SynthConfig, layout: Layout, v: np.ndarray) -> np.ndarray:
    """Labels of node ids `v`: their community, or a random class for a `label_noise` fraction.

    The noise is a hash of (seed, v), so any task can compute any node's label.
    """
    label = layout.community(v)
    if cfg.label_noise > 0:
        h = _mix64(v.astype(np.uint64) ^ np.uint64(_mix64(np.array([cfg.seed ^ _TAG_LABELS], np.uint64))[0]))
        flip = (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53) < cfg.label_noise
        random_class = (_mix64(h) % np.uint64(cfg.num_classes)).astype(np.int64)
        label = np.where(flip, random_class, label)
    return label.astype(np.int64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a well-mixed 64-bit hash of each element (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def centroids(cfg: SynthConfig) -> np.ndarray:
    """Class centroids [C, dim] (float32), each of unit length, shared by every task."""
    rng = np.random.default_rng([cfg.seed, _TAG_CENTROIDS])
    mu = rng.standard_normal((cfg.num_classes, cfg.feature_dim))
    mu /= np.linalg.norm(mu, axis=1, keepdims=True)
    return mu.astype(np.float32)


# ---------------------------------------------------------------------------- one task

def _out_degrees(cfg: SynthConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    """Pareto out-degrees with exponent gamma and mean avg_degree/2 (stochastically rounded)."""
    gamma = cfg.degree_exponent
    mean = cfg.avg_degree / 2
    x_min = mean * (gamma - 2) / (gamma - 1)
    d = x_min * rng.random(n) ** (-1.0 / (gamma - 1))
    d = np.minimum(d, cfg.num_nodes - 1)
    whole = np.floor(d)
    return (whole + (rng.random(n) < d - whole)).astype(np.int64)


def _edges(cfg: SynthConfig, layout: Layout, rng: np.random.Generator, lo: int, hi: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """Undirected edges drawn by nodes [lo, hi): unique (u, v) pairs, u < v, no self-loops."""
    n_comm = cfg.num_classes
    deg = _out_degrees(cfg, rng, hi - lo)
    src = np.repeat(np.arange(lo, hi, dtype=np.int64), deg)
    m = len(src)
    c_src = layout.community(src)
    if n_comm > 1:
        other = (c_src + 1 + rng.integers(0, n_comm - 1, m)) % n_comm
        c_dst = np.where(rng.random(m) < cfg.homophily, c_src, other)
    else:
        c_dst = c_src
    # Zipf-like member choice: P(j < x) = (x/m)**(1/s) makes in-degree ~ rank**-(1 - 1/s),
    # a power law of exponent gamma when s = (gamma-1)/(gamma-2).
    skew = (cfg.degree_exponent - 1) / (cfg.degree_exponent - 2)
    size = layout.members(c_dst)
    j = np.minimum((size * rng.random(m) ** skew).astype(np.int64), size - 1)
    if cfg.locality > 0:      # drawn after the others: graphs without locality keep their random stream
        local = (c_dst == c_src) & (rng.random(m) < cfg.locality)
        offset = rng.geometric(1.0 / LOCAL_WIDTH, m) * np.where(rng.random(m) < 0.5, -1, 1)
        j = np.where(local, (layout.rank(src) // n_comm + offset) % size, j)
    dst = layout.node(c_dst, j)
    keep = src != dst
    u, v = np.minimum(src[keep], dst[keep]), np.maximum(src[keep], dst[keep])
    key = np.sort(u * cfg.num_nodes + v)  # sort + neighbour compare: faster than np.unique's hashing
    key = key[np.concatenate([[True], key[1:] != key[:-1]])]
    return key // cfg.num_nodes, key % cfg.num_nodes


def _split_codes(cfg: SynthConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    bounds = np.cumsum([cfg.train_frac, cfg.val_frac, cfg.test_frac])
    return np.searchsorted(bounds, rng.random(n), side="right").astype(np.uint8)


def _feature_chunks(cfg: SynthConfig, rng: np.random.Generator, layout: Layout, lo: int, hi: int
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    mu = centroids(cfg) * np.float32(cfg.signal)
    for start in range(lo, hi, FEATURE_CHUNK_ROWS):
        ids = np.arange(start, min(start + FEATURE_CHUNK_ROWS, hi), dtype=np.int64)
        x = rng.standard_normal((len(ids), cfg.feature_dim), dtype=np.float32)
        x *= np.float32(cfg.noise)
        x += mu[layout.community(ids)]
        yield ids, x.astype(cfg.dtype, copy=False)


def synth_part(cfg: SynthConfig, out_dir: str | os.PathLike[str], part: int) -> dict[str, Any]:
    """Generate node range `part` and write its edges, features and nodes shards.

    Each shard is written under a temporary name and renamed, so a killed task leaves no
    file that matches `part-*.parquet|arrow`. Deterministic for (cfg.seed, part).

    Args:
        cfg: the generator config.
        out_dir: the raw dataset directory (usually a staging directory).
        part: task index; generates nodes [part*part_nodes, min((part+1)*part_nodes, N)).

    Returns:
        Counts for the manifest: part, nodes, edges (stored, both directions), feature_bytes,
        split_counts (per SPLITS), same_label_edges (stored edges whose ends share a label).
    """
    lo, hi = cfg.part_range(part)
    out = Path(out_dir)
    rng = np.random.default_rng([cfg.seed, part])
    layout = Layout.of(cfg)

    u, v = _edges(cfg, layout, rng, lo, hi)
    src, dst = np.concatenate([u, v]), np.concatenate([v, u])
    num_edges = write_edge_shard(out / "edges" / shard_name(part, "parquet"), src, dst)
    same_label = 2 * int(np.count_nonzero(labels_of(cfg, layout, u) == labels_of(cfg, layout, v)))
    del u, v, src, dst

    ids = np.arange(lo, hi, dtype=np.int64)
    codes = _split_codes(cfg, rng, hi - lo)
    write_node_shard(out / "nodes" / shard_name(part, "parquet"), ids, labels_of(cfg, layout, ids), codes)

    suffix = "arrow" if cfg.feature_format == "arrow" else "parquet"
    write_feature_shard(out / "features" / shard_name(part, suffix), _feature_chunks(cfg, rng, layout, lo, hi),
                        cfg.feature_dim, cfg.dtype, cfg.feature_format)
    return {
        "part": part, "nodes": hi - lo, "edges": num_edges,
        "feature_bytes": (hi - lo) * cfg.feature_dim * np.dtype(cfg.dtype).itemsize,
        "split_counts": np.bincount(codes, minlength=len(SPLITS)).tolist(),
        "same_label_edges": same_label,
    }
