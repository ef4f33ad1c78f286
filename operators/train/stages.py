"""The stages of a `PackedLoader` run in order: in the caller's thread (`sequential`), or load, assemble and
graph each on a thread of its own joined by bounded queues (`pipelined`, docs/design.md's "The
pipelined trainer"); what the load and graph stages read, batch by batch (`records`, `samples`);
and the graph stage's own work (`load_labels`, `node_labels`).

The loader does a batch's work (`PackedLoader._pieces`, `_assemble`, `_samples`, `_join`); these
functions only order it: which thread runs what, the queues and staging buffers between them,
the stage clocks, and the checks that features and graphs meet batch by batch. Both yield the
same batches; the pipelined one overlaps the reads with assembly and training.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import InputError
from ..formats.npyio import load_npy
from ..formats.packed import PackedDataset, SuperbatchEntry
from ..formats.packedindex import IndexRecord
from ..formats.samples import SampleRecord
from .pipe import END, Pipe, StageClock, Stopped, guard

if TYPE_CHECKING:
    from .loader import PackedLoader

__all__ = ["covering", "load_labels", "node_labels", "pipelined", "records", "samples", "sequential"]


def covering(superbatches: Sequence[SuperbatchEntry], lo: int, hi: int) -> list[SuperbatchEntry]:
    """The superbatches holding any of global batches [lo, hi)."""
    return [s for s in superbatches if s.first_batch < hi and s.first_batch + s.batches > lo]


def records(ds: PackedDataset, superbatches: Sequence[SuperbatchEntry], lo: int, hi: int
            ) -> Iterator[tuple[int, IndexRecord]]:
    """The load stage's input: global batches [lo, hi)'s index records, in order, with their numbers."""
    for sb in covering(superbatches, lo, hi):
        for j, rec in enumerate(ds.index(sb.key)):
            g = sb.first_batch + j
            if lo <= g < hi:
                yield g, rec


def samples(ds: PackedDataset, superbatches: Sequence[SuperbatchEntry], lo: int, hi: int
            ) -> Iterator[tuple[int, SampleRecord]]:
    """The graph stage's input: global batches [lo, hi)'s stored samples, in order, with their numbers (an
    InputError when a superbatch holds other than the manifest's number)."""
    for sb in covering(superbatches, lo, hi):
        count = 0
        for j, s in enumerate(ds.samples(sb.key)):
            count += 1
            g = sb.first_batch + j
            if lo <= g < hi:
                yield g, s
        if count != sb.batches:
            raise InputError(ds.round_dir / "samples", f"superbatch {sb.key} holds {count} samples, the "
                                                       f"manifest says {sb.batches}")


def load_labels(ds: PackedDataset) -> np.ndarray:
    """The dataset's labels, one int64 per node (the graph stage's ``y``); an InputError when missing or bad."""
    name = ds.manifest.get("labels")
    if not name:
        raise InputError(ds.path / "manifest.json", "no labels (prepared by an older version; re-run "
                                                    "prepare with force=True)")
    p = ds.path / str(name)
    try:
        labels = load_npy(p)
    except (OSError, ValueError) as e:
        raise InputError(p, f"unreadable labels ({e})") from e
    if labels.shape != (ds.num_nodes,) or labels.dtype.kind not in "iu":
        raise InputError(p, f"expected int labels [{ds.num_nodes}], found {labels.dtype}{list(labels.shape)}")
    return labels.astype(np.int64, copy=False)


def node_labels(labels: np.ndarray | None, s: SampleRecord, ds: PackedDataset) -> torch.Tensor | None:
    """The graph stage: the labels of sample `s`'s nodes (its ``n_id`` made int64 and writable for torch);
    None for a table of rows alone (no labels)."""
    if not s.n_id.flags.writeable or s.n_id.dtype != np.int64:    # memory-mapped from the samples file (torch
        s.n_id = s.n_id.astype(np.int64)                            # wants its own) or int32 there (PyG: int64)
    if labels is None:
        return None
    n_id = s.n_id
    if n_id.size and (int(n_id.min()) < 0 or int(n_id.max()) >= labels.shape[0]):
        raise InputError(ds.round_dir / "samples", f"batch {s.batch}: node id out of range")
    return torch.from_numpy(labels[n_id])


def sequential(loader: PackedLoader, lo: int, begin: int, end: int) -> Iterator[Data]:
    """Batches [begin, end) one after another in the caller's thread, each piece assembled before the next one
    reuses the one staging buffer; batches [lo, begin) only advance the CPU tier."""
    buf = loader._buffers[0]
    ck = loader.clocks
    samples = loader._samples(begin, end)
    for g, rec in loader._records(lo, end):
        pieces = loader._pieces(g, rec, lambda: buf, g >= begin)
        x = None
        while True:         # each piece is assembled before the next one reuses the buffer
            t0 = time.perf_counter()
            pc = next(pieces, None)
            t1 = time.perf_counter()
            ck["load"].busy += t1 - t0
            if pc is None:
                break
            x = loader._assemble(pc)
            ck["assemble"].busy += time.perf_counter() - t1
        if x is None:
            continue
        t2 = time.perf_counter()
        got = next(samples, None)
        if got is None or got[0] != g:
            raise InputError(loader.path, "the index and the samples hold different numbers of batches" if got is None
                             else f"batch order broken: features of {g}, graph of {got[0]}")
        s = got[1]
        y = node_labels(None if loader.rows_only else loader.labels, s, loader.ds)
        ck["graph"].busy += time.perf_counter() - t2
        yield loader._join(g, rec, x, s, y)


def pipelined(loader: PackedLoader, lo: int, begin: int, end: int) -> Iterator[Data]:
    """Batches [begin, end) through the plan, load, assemble and graph threads (bounded queues of the loader's
    depth), joined in batch order in the caller's thread; batches [lo, begin) only advance the CPU tier.
    Planning a batch's requests (`_plan`) runs ahead of its reads (`_read_planned`), so the disk is not idle
    while the next batch's requests are worked out.
    A stage's error stops every stage and is raised here; so is a batch out of order."""
    pipe = Pipe()
    q = loader.queue_depth
    free: queue.Queue = queue.Queue()
    for b in loader._buffers:
        free.put(b)
    planned: queue.Queue = queue.Queue(q)
    loaded: queue.Queue = queue.Queue(q)
    assembled: queue.Queue = queue.Queue(q)
    graphs: queue.Queue = queue.Queue(q)
    ck = loader.clocks
    planning = StageClock()     # the load stage's first half, on a thread of its own; its busy joins load's

    def plan() -> None:         # the next batches' requests, worked out while the load stage's reads run
        for g, rec in loader._records(lo, end):
            t = time.perf_counter()
            p = loader._plan(g, rec, g >= begin)
            planning.busy += time.perf_counter() - t
            pipe.put(planned, p, planning)
        pipe.put(planned, END, planning)

    def load() -> None:
        clock = ck["load"]
        while (p := pipe.get(planned, clock)) is not END:
            pieces = loader._read_planned(p, lambda: pipe.get(free, clock))
            while True:
                waited, t = clock.starved, time.perf_counter()
                pc = next(pieces, None)
                clock.busy += time.perf_counter() - t - (clock.starved - waited)   # not the wait for a buffer
                if pc is None:
                    break
                pipe.put(loaded, pc, clock)
        pipe.put(loaded, END, clock)

    def assemble() -> None:
        while (pc := pipe.get(loaded, ck["assemble"])) is not END:
            t = time.perf_counter()
            x = loader._assemble(pc)
            if pc.buffer is not None:
                free.put(pc.buffer)
            ck["assemble"].busy += time.perf_counter() - t
            if x is not None:
                pipe.put(assembled, (pc.batch, pc.record, x), ck["assemble"])
        pipe.put(assembled, END, ck["assemble"])

    def graph() -> None:
        for g, s in loader._samples(begin, end):
            t = time.perf_counter()
            y = node_labels(None if loader.rows_only else loader.labels, s, loader.ds)
            ck["graph"].busy += time.perf_counter() - t
            pipe.put(graphs, (g, s, y), ck["graph"])
        pipe.put(graphs, END, ck["graph"])

    threads = [threading.Thread(target=guard(pipe, fn), name=f"diskflow-{fn.__name__}", daemon=True)
               for fn in (plan, load, assemble, graph)]
    for t in threads:
        t.start()
    try:
        expect = begin
        while True:
            item = pipe.get(assembled, ck["train"])
            gitem = pipe.get(graphs, ck["train"])
            if item is END or gitem is END:
                if item is not gitem:
                    raise InputError(loader.path, "the index and the samples hold different numbers of batches")
                break
            g, rec, x = item
            gs, s, y = gitem
            if not g == gs == expect:
                raise InputError(loader.path, f"batch order broken: features of {g}, graph of {gs}, expected {expect}")
            if loader.device.type == "cuda":
                x.record_stream(torch.cuda.current_stream(loader.device))
            data = loader._join(g, rec, x, s, y)
            del item, gitem, x, y
            expect += 1
            yield data
            del data
        if expect != end:
            raise InputError(loader.path, f"the round ended after batch {expect}, expected {end}")
    except Stopped:
        pass
    finally:
        pipe.stop.set()
        for t in threads:
            t.join()
        ck["load"].busy += planning.busy
    if pipe.error is not None:
        raise pipe.error

