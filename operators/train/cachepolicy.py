"""The row cache's policies (`rowcache.RowCache`): which key an admitted row gets, what a use does to it,
and which slots give way first.

Each policy means one thing whichever way the cache is used (read-through or planned, see `rowcache`):

* ``"degree"``: a row's key is its node's out-degree, the number of neighbour lists that hold it
  (counted once, natively, from the store's ``indices``: an int32 per node). A uniform neighbour sampler
  draws a node about that much more often than a node of degree one: the static degree cache of
  out-of-core GNN loaders, filled as rows are read (nothing is read ahead).
* ``"lru"``: a row's key is the call or batch that last used it, least recently used first (GNNDrive's
  standby list).
* ``"hybrid"`` (planned only: it looks ahead): LSM-GNN's order. A slot's level is its row's next use in
  a lookahead window of batches (empty slot; no use; a use beyond the threshold; a use within it, kept
  longest), and within a level the lowest key, the node's in-degree, goes first.

Kept apart from the cache because a policy is a choice over the cache's tables, not a part of its
bookkeeping: the cache calls `keys`, `used` and `order`, and never asks which policy it holds.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ConfigError
from ...native.kernels import count_dense
from ..prepare.samplers import global_indptr, global_sources

if TYPE_CHECKING:
    from .rowcache import RowCache

__all__ = ["POLICIES", "POLICY_TYPES", "READ_THROUGH", "InDegree", "LeastRecentlyUsed", "Lookahead", "OutDegree",
           "Policy", "policy_for"]

_NO_USE = np.iinfo(np.int64).max


class Policy:
    """What a row cache keeps: the key an admitted row gets, what a use does to it, and the order in which
    slots give way (lowest first).

    Attributes:
        name: the policy's name in `POLICIES`.
        fixed_keys: a row's key does not change with use (a read-through call's hits are pinned instead).
        lookahead: the order needs the next batches' node ids (a planned cache's window).
        node_bytes: bytes per node the policy holds beside the cache's node table.
    """

    name = ""
    fixed_keys = True
    lookahead = False
    node_bytes = 0

    def keys(self, nodes: np.ndarray, tick: int) -> np.ndarray:
        """The keys (int64) of rows of `nodes` admitted at call or batch `tick`."""
        raise NotImplementedError

    def used(self, key: np.ndarray, slots: np.ndarray, tick: int) -> None:
        """The rows in `slots` were used at `tick` (their keys, `key[slots]`, may change)."""

    def order(self, cache: RowCache, slots: np.ndarray, window: list[np.ndarray] | None) -> np.ndarray:
        """The rank of `slots` (int64): the lowest give way first."""
        return cache.key[slots]

    def arrays(self) -> list[np.ndarray]:
        """The per-node arrays the policy holds (counted in the cache's tables)."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LeastRecentlyUsed(Policy):
    """``"lru"``: a row's key is the call or batch that last used it."""

    name, fixed_keys = "lru", False

    def keys(self, nodes: np.ndarray, tick: int) -> np.ndarray:
        return np.full(nodes.shape[0], tick, np.int64)

    def used(self, key: np.ndarray, slots: np.ndarray, tick: int) -> None:
        key[slots] = tick


class OutDegree(Policy):
    """``"degree"``: a row's key is its node's out-degree, counted from `indices` (the CSC's neighbour lists)."""

    name, node_bytes = "degree", 4

    def __init__(self, indices: np.ndarray, num_nodes: int) -> None:
        self.degree = np.zeros(num_nodes, np.int32)
        count_dense([np.ascontiguousarray(indices)], self.degree)

    def keys(self, nodes: np.ndarray, tick: int) -> np.ndarray:
        return self.degree[nodes].astype(np.int64)

    def arrays(self) -> list[np.ndarray]:
        return [self.degree]


class InDegree:
    """Each node's in-degree, read from the CSC's `indptr` when asked (no array over every node)."""

    def __init__(self, indptr: np.ndarray) -> None:
        self.indptr = indptr

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        return np.asarray(self.indptr[ids + 1], np.int64) - np.asarray(self.indptr[ids], np.int64)


class Lookahead(Policy):
    """``"hybrid"``: LSM-GNN's levels over a window of the next batches, then the lowest static score.

    Args:
        static: each node's static score (an integer array over nodes, or `InDegree`), read once per
            admitted row.
        threshold: next uses at most this many batches ahead are kept longest.
    """

    name, lookahead = "hybrid", True

    def __init__(self, static: Any, threshold: int = 1) -> None:
        self.scores, self.threshold = static, max(1, int(threshold))

    def keys(self, nodes: np.ndarray, tick: int) -> np.ndarray:
        return np.asarray(self.scores[nodes], np.int64) if nodes.size else np.zeros(0, np.int64)

    def order(self, cache: RowCache, slots: np.ndarray, window: list[np.ndarray] | None) -> np.ndarray:
        """Level (empty; no use in the window; a use beyond the threshold; a use within it), then the key.
        The window is scanned whole for every batch, so the paper's "recently inserted" level is empty."""
        next_use = cache.next_use
        next_use.fill(_NO_USE)
        window = window or []
        for ahead in range(len(window), 0, -1):           # farthest first: the nearest use is written last
            s = cache.slot_of[window[ahead - 1]]
            next_use[s[s >= 0]] = ahead
        ahead_of = next_use[slots]
        level = np.where(cache.node_of[slots] < 0, 0,
                         np.where(ahead_of == _NO_USE, 1, np.where(ahead_of > self.threshold, 2, 3))).astype(np.int64)
        return (level << 40) + np.minimum(cache.key[slots], (1 << 40) - 1)

    def __repr__(self) -> str:
        return f"Lookahead(threshold={self.threshold})"


POLICY_TYPES: dict[str, type[Policy]] = {"degree": OutDegree, "lru": LeastRecentlyUsed, "hybrid": Lookahead}
POLICIES = tuple(POLICY_TYPES)                                     # every policy's name
READ_THROUGH = tuple(n for n, t in POLICY_TYPES.items() if not t.lookahead)   # those a read-through cache takes


def policy_for(name: str, store: Any = None, *, static: Any = None, threshold: int = 1,
               allowed: Sequence[str] = POLICIES) -> Policy:
    """The policy called `name`, over `store`'s topology where it needs one (``"degree"``: the out-degrees
    of its ``indices``; ``"hybrid"``: `static`, or the in-degrees of its ``indptr``).

    Raises:
        ConfigError: (``policy``) a name not in `allowed`, or a policy without the scores it needs.
    """
    if name not in allowed:
        raise ConfigError("policy", f"expected one of {', '.join(allowed)}, got {name!r}")
    if name == "lru":
        return LeastRecentlyUsed()
    if name == "degree":
        if store is None:
            raise ConfigError("policy", "the degree policy needs the store's topology")
        return OutDegree(global_sources(store), int(store.num_nodes))
    if static is None and store is None:
        raise ConfigError("policy", "the hybrid policy needs a static score per node")
    return Lookahead(InDegree(global_indptr(store)) if static is None else static, threshold)
