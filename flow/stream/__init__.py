"""Streaming: preprocessing on CPU workers, training on the GPU worker, one Dask graph, bounded by a window.

Per superbatch k of the round (epoch-major, so epoch e+1 is sampled while epoch e trains)::

    sample-e{e}-s{k}  -> plan-e{e}-s{k} -> pack-e{e}-s{k}  -> ship-e{e}-s{k} -> train-e{e}-s{k}
    (CPU workers)        (chained: k-1)   (CPU workers)       (GPU worker)      (GPU worker, in order)

plus, once: ``count-*`` over the first superbatches (``--tier-superbatches``), ``count-merge-*``,
``tiers`` (GPU tier and the CPU tier's first content), ``header`` (the manifest fields every
staged superbatch shares), ``pack-base`` and ``ship-base`` (the tier rows and labels). Sample,
count, tiers, ``trace-*`` and plan are the preparation graph `diskflow prepare` runs too
(`flow.graph`, the same task functions, builder and keys); the stream is its other sink. Plan k
starts from plan k-1's CPU cache and looks ahead into superbatch k+1, exactly as offline (the window
is traced by ``trace-*`` beside the chain when its samples are already submitted, as with more than one
CPU worker; otherwise the plan task traces it); ``plan-*`` of the next epoch chains on this epoch's last plan.

Placement is by annotation at submission (``client.submit(..., resources=...)``; nothing is
fused, so nothing can drop an annotation): ``train-*`` asks for ``GPU=1``; ``ship-*`` for
``GPU=0`` — only a worker that has the resource may run it, but it does not take the GPU, so
superbatch k+1 is staged while k trains. Both are also pinned to the one GPU worker the run
uses (its scratch holds the staged files and its memory the model). Preprocessing is
restricted to the workers without the resource, so the GPU worker only trains. Train k+1 is
queued on the GPU worker while k runs (the resource makes them take turns, priorities keep
stream order), so it starts the moment k ends, without a round trip to the scheduler.

Backpressure: the driver submits superbatch k+W's preparation only when ``train`` k has
finished, so at most W superbatches are staged on the GPU worker's scratch (each deleted by
the ``train`` that consumed it, in the background, before the next ``ship`` reserves space) and
preprocessing runs at most W superbatches ahead; a task's result is released as soon as nothing
downstream can need it. ``train`` k is submitted when ``ship`` k has succeeded; a superbatch
that fails verification on arrival is packed and shipped once more, then the run stops naming
it. At the start only the first superbatch is prepared (the rest of the window follows once its
plan is done), so the GPU worker's first wait is as short as the critical path allows; after
that, plan k and its lookahead sample are submitted when plan k-1 is done, so that a CPU worker
never starts sampling ahead while a pack the GPU worker waits for is about to become ready.

Failures: a CPU worker lost mid-run costs only time (Dask recomputes its tasks; everything is
deterministic, so the checksums and losses are the same). A lost GPU worker stops the run with
the position of its last checkpoint (written into the run directory after every
``--checkpoint-every`` superbatches); ``--resume`` continues from there, re-deriving the tiers
and re-reading the CPU tier's rows for the checkpoint's ids.
"""
from __future__ import annotations

from typing import Any

from ..graph import MAX_ROWS_MARGIN, PlanResult, SampleResult, Tiers
from .config import PHASES, StreamConfig, StreamStopped

__all__ = ["MAX_ROWS_MARGIN", "PHASES", "PlanResult", "SampleResult", "StreamConfig", "StreamRun", "StreamStopped",
           "Tiers"]


def __getattr__(name: str) -> Any:
    """`StreamRun`, imported on first use: the driver imports Dask, `StreamConfig`'s defaults do not need it."""
    if name == "StreamRun":
        from .driver import StreamRun

        return StreamRun
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
