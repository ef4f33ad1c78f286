"""`run_synth`: generate a synthetic raw dataset as a Dask graph, one task per node range."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..operators.formats.atomic import staging_dir
from ..operators.formats.manifest import write_manifest
from ..operators.formats.outputs import check_free_space, check_replaceable
from ..operators.formats.store import SPLITS
from ..operators.ingest.rawwriter import RAW_FORMAT, RAW_KIND, RAW_VERSION
from ..operators.ingest.synth import SynthConfig, synth_part
from .progress import compute

__all__ = ["run_synth"]


def run_synth(cfg: SynthConfig, out: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Generate `cfg`'s graph into `out` (a raw dataset directory) and return its path.

    Tasks `synth-<part>` each write one edges, features and nodes shard into a staging
    directory next to `out`; it replaces `out` only after all of them finished and
    `manifest.json` was written, so an interrupted run leaves no valid-looking output.
    Runs on the active scheduler (a distributed Client if one exists, else the local
    one); with a remote cluster, `out` must be on a filesystem every worker sees.

    Args:
        cfg: what to generate.
        out: the raw dataset directory.
        force: regenerate even when `out` already holds this config's output; also
            allows replacing a directory that is not a raw dataset.

    Raises:
        InputError: `out` holds something other than a raw dataset (without `force`).
        DiskFullError: `out`'s filesystem cannot hold the features, or filled up while writing.

    Returns:
        `out` as a Path.
    """
    import dask

    cfg.validate()
    out_p = Path(out)
    previous = check_replaceable(out_p, force, RAW_KIND)
    if (previous is not None and not force and previous.get("source", {}).get("kind") == "synth"
            and previous.get("config") == cfg.as_dict()):
        return out_p
    # the feature shards alone hold every row (a lower bound: edges and nodes come on top)
    check_free_space({out_p: cfg.num_nodes * cfg.feature_dim * np.dtype(cfg.dtype).itemsize})
    with staging_dir(out_p) as stage:
        for sub in ("edges", "features", "nodes"):
            (stage / sub).mkdir()
        tasks = [dask.delayed(synth_part)(cfg, str(stage), p, dask_key_name=f"synth-{p}")
                 for p in range(cfg.num_parts)]
        parts = compute(tasks, desc="synth")
        write_manifest(stage, _manifest(cfg, parts))
    return out_p


def _manifest(cfg: SynthConfig, parts: list[dict[str, Any]]) -> dict[str, Any]:
    num_edges = sum(p["edges"] for p in parts)
    split_counts = np.sum([p["split_counts"] for p in parts], axis=0).tolist()
    return {
        "format": RAW_FORMAT, "version": RAW_VERSION,
        "source": {"kind": "synth"},
        "config": cfg.as_dict(),
        "num_nodes": cfg.num_nodes, "num_edges": num_edges, "num_classes": cfg.num_classes,
        "feature_dim": cfg.feature_dim, "feature_dtype": cfg.dtype, "feature_format": cfg.feature_format,
        "feature_bytes": sum(p["feature_bytes"] for p in parts),
        "split_counts": dict(zip(SPLITS, split_counts)),
        "edge_homophily": sum(p["same_label_edges"] for p in parts) / max(1, num_edges),
        "shards": {"edges": cfg.num_parts, "features": cfg.num_parts, "nodes": cfg.num_parts},
    }
