"""The automatic memory split of OUTRE §4.4: how much of the CPU budget goes to the historical
embedding cache and how much to the feature cache.

A bigger embedding cache prunes more subtrees (fewer rows to read at all); a bigger feature
cache serves more of the rows that remain. OUTRE estimates both savings from a profiling
epoch; diskflow plans offline, so `flow.prepare` samples and plans the round once per candidate
share and counts the rows each plan sends to disk exactly: a grid of shares, then the midpoints
between the best of it and its neighbours. The split with the fewest disk bytes wins (ties: the
smaller embedding cache); the whole curve is kept in the packed dataset's
figures and drawn as ``memory_split.png`` (OUTRE's Fig. 5 on this graph).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..operators.formats.atomic import atomic_path
from ..operators.formats.sizes import format_bytes

__all__ = ["SPLIT_PLOT", "SPLIT_SHARES", "best_split", "describe_split", "plot_memory_split", "refine_shares",
           "split_point"]

SPLIT_SHARES = (0.0, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4)   # the embedding cache's candidate shares (0 first)
SPLIT_PLOT = "memory_split.png"


def split_point(share: float, shared: int, history_bytes: int, history_rows: int, accesses: int,
                disk_rows: int, row_bytes: int, pruned: int, cpu_bytes: int) -> dict[str, Any]:
    """One candidate of the curve (`shared`: the bytes both caches share; `cpu_bytes`: the CPU tier
    its plan got), as JSON values."""
    return {"share": share, "history_bytes": history_bytes, "history_rows": history_rows,
            "cpu_bytes": cpu_bytes, "accesses": accesses, "disk_rows": disk_rows,
            "disk_bytes": disk_rows * row_bytes, "pruned": pruned}


def refine_shares(curve: list[dict[str, Any]]) -> list[float]:
    """The shares between the best candidate so far and its neighbours on the curve (by share) not yet
    tried: where the fewest bytes lie when the grid straddles them."""
    pts = sorted(curve, key=lambda p: p["share"])
    if len(pts) < 2:
        return []
    i = pts.index(best_split(pts))
    tried = {p["share"] for p in pts}
    mids = [(pts[j]["share"] + pts[i]["share"]) / 2 for j in (i - 1, i + 1) if 0 <= j < len(pts)]
    return [m for m in mids if m not in tried]


def best_split(curve: list[dict[str, Any]]) -> dict[str, Any]:
    """The candidate that reads the fewest bytes from disk (ties: the smaller embedding cache)."""
    return min(curve, key=lambda p: (p["disk_bytes"], p["history_bytes"]))


def describe_split(split: dict[str, Any]) -> str:
    """One line: the chosen split and what it saves against no embedding cache."""
    chosen = split["chosen"]
    none = next((p for p in split["curve"] if p["history_bytes"] == 0), None)
    saved = "" if none is None or not chosen["disk_bytes"] else \
        f", {none['disk_bytes'] / chosen['disk_bytes']:.2f}x fewer disk bytes than no embedding cache"
    return (f"{chosen['share']:.1%} of {format_bytes(split['budget'])} to embeddings "
            f"({chosen['history_rows']:,} rows), {format_bytes(chosen['disk_bytes'])} from disk per round{saved}")


def plot_memory_split(path: str | os.PathLike[str], split: dict[str, Any]) -> Path:
    """Draw the curve (disk bytes and rows gathered against the embedding cache's share) to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted(split["curve"], key=lambda p: p["share"])
    xs = [100 * p["share"] for p in pts]
    fig, ax = plt.subplots(figsize=(6, 4))
    try:
        ax.plot(xs, [p["disk_bytes"] / 2**20 for p in pts], "o-", label="read from disk")
        ax.plot(xs, [p["accesses"] * split["row_bytes"] / 2**20 for p in pts], "s--", label="rows gathered")
        best = split["chosen"]
        ax.plot([100 * best["share"]], [best["disk_bytes"] / 2**20], "r*", markersize=14, label="chosen")
        ax.set_xlabel(f"embedding cache, % of the {format_bytes(split['budget'])} both caches share")
        ax.set_ylabel("MiB per round")
        ax.set_title(f"memory split (staleness {split['staleness']})")
        ax.legend()
        fig.tight_layout()
        with atomic_path(Path(path)) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)
    return Path(path)
