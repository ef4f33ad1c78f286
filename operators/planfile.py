"""A superbatch's plan on disk: the per-batch arrays concatenated, with offsets (one .npz)."""
from __future__ import annotations

import os

import numpy as np

from .errors import InputError
from .files import atomic_path
from .plan import BatchPlan, SuperbatchPlan


def save_plan(path: str | os.PathLike[str], plan: SuperbatchPlan, parents: bool = True) -> None:
    """Write a `SuperbatchPlan` atomically (`parents=False`: into an existing directory only, see `atomic_path`)."""
    b = plan.batches
    offsets = np.r_[0, np.cumsum([p.src.shape[0] for p in b])].astype(np.int64)
    ins_offsets = np.r_[0, np.cumsum([p.insert_pos.shape[0] for p in b])].astype(np.int64)
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt))
    with atomic_path(path, parents=parents) as tmp, open(tmp, "wb") as f:
        np.savez(f, offsets=offsets, ins_offsets=ins_offsets,
                 src=cat([p.src for p in b], np.uint8), idx=cat([p.idx for p in b], np.int64),
                 insert_pos=cat([p.insert_pos for p in b], np.int64),
                 insert_slot=cat([p.insert_slot for p in b], np.int64),
                 final_cache=np.asarray(plan.final_cache, np.int64),
                 counts=np.array([plan.hits, plan.misses, plan.gpu_hits], np.int64))


def load_plan(path: str | os.PathLike[str]) -> SuperbatchPlan:
    """Read a plan written by `save_plan`."""
    try:
        with np.load(path) as z:
            d = {k: z[k] for k in z.files}
    except (OSError, ValueError, KeyError) as e:
        raise InputError(path, f"unreadable plan file ({e})") from e
    cuts, icuts = d["offsets"][1:-1], d["ins_offsets"][1:-1]
    batches = [BatchPlan(s, i, p, q) for s, i, p, q in zip(
        np.split(d["src"], cuts), np.split(d["idx"], cuts),
        np.split(d["insert_pos"], icuts), np.split(d["insert_slot"], icuts))]
    hits, misses, gpu_hits = (int(x) for x in d["counts"])
    return SuperbatchPlan(batches, d["final_cache"], hits, misses, gpu_hits)
