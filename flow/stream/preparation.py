"""The CPU side of a streamed run's schedule: each superbatch's samples, its plan on each Belady chain, and
each lane's pack and ship of its share, kept a window ahead of training.

Per superbatch k (see `flow.stream`'s docstring): ``sample`` k (and, with several GPU workers,
each lane's ``select`` of it), ``plan`` k chained on plan k-1, ``trace`` of its window where the
samples are already there, then per lane ``pack`` k and ``ship`` k to its GPU worker. Once per
run, the head: counts over the first superbatches, the tiers, and each lane's ``header``,
``pack-base`` and ``ship-base``. `Preparation` holds these futures and the order they may be
submitted in; the driver (`driver.StreamRun`) tells it when a plan is done and a window slot is
free, and is told (`on_shipped`) when a lane's share of a superbatch is on its GPU worker.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...operators.formats.rowcodec import RowCodec
from ...operators.prepare.policies import policy_id
from ...operators.prepare.superbatch import SuperbatchRef
from ...operators.prepare.tiers import STAGING_PIECE_BYTES
from ...operators.prepare.typedsample import as_fanouts, fanouts_json
from ..graph import PrepGraph, TierSpec
from .checkpoints import checkpoint_due
from .config import StreamConfig
from .lanes import EdgeLane, Lane
from .placement import Placement
from .tasks import (
    edge_sample_task,
    edge_split_task,
    final_cache_task,
    header_task,
    pack_base_task,
    pack_task,
    select_task,
    ship_task,
)
from .workers import on_gpu

__all__ = ["Preparation"]


class Preparation:
    """The futures of the superbatches' preparation and the rules of their submission (module docstring).

    Args:
        place: the run's placement (and the futures its driver watches).
        cfg: the run's configuration.
        refs: the round's superbatches.
        lanes: one per GPU worker.
        planner: the shared tier's Belady chain over the merged stream (``--cache shared``), or None.
        graph: the preparation graph the superbatches are sampled by.
        store_path: the store, as the CPU workers read it.
        tok: ends the run's task keys.
        start: the first superbatch this run trains (after a resume, the checkpoint's position).
        on_shipped: called with a lane whose next share may be trained (shipped, or empty).
        edge_rows: the rows of the store's edge features, whose reads each lane plans on a chain of its own
            (`lanes.EdgeLane`); 0: the store has none.
        codec: the node rows' encoding in the tiers and bundles (None: exact).
    """

    def __init__(self, place: Placement, cfg: StreamConfig, refs: list[SuperbatchRef], lanes: list[Lane],
                 planner: Lane | None, graph: PrepGraph, store_path: str, tok: str, start: int,
                 on_shipped: Callable[[Lane], None], edge_rows: int = 0, codec: RowCodec | None = None) -> None:
        self.place, self.cfg, self.refs, self.lanes, self.planner = place, cfg, refs, lanes, planner
        self.graph, self.store_path, self.tok, self.start, self.on_shipped = graph, store_path, tok, start, on_shipped
        self.edge_rows, self.codec = edge_rows, codec
        self.n, self.gpus, self.shared = len(refs), len(lanes), planner is not None
        self.samples: dict[int, Any] = {}       # the superbatches' samples (every lane's source)
        self.final_ids: dict[int, Any] = {}     # shared tier: k -> the tier plan k leaves (checkpoints)

    def sample(self, k: int) -> Any:
        if k >= self.n:
            return None
        if k not in self.samples:
            self.samples[k] = self.place.watched(self.graph.sample(k), "sample", k)
        return self.samples[k]

    def lane_sample(self, lane: Lane, k: int) -> Any:
        """Lane's share of superbatch k's samples (the samples themselves with one GPU worker)."""
        if k >= self.n:
            return None
        if self.gpus == 1 or lane.rank < 0:      # one worker, or the shared tier's planner: the whole superbatch
            return self.sample(k)
        if k not in lane.f["select"]:
            lane.f["select"][k] = self.place.client.submit(select_task, self.sample(k), lane.rank, self.gpus,
                                                     key=f"select-{self.refs[k].key}-{lane.tok}", **self.place.cpu(k))
        return lane.f["select"][k]

    def edge_sample(self, lane: Lane, k: int) -> Any:
        """Lane's edge-row samples of superbatch k (`tasks.edge_sample_task` over its share's samples)."""
        e = lane.edges
        if e is None or k >= self.n:
            return None
        if k not in e.f["sample"]:
            e.f["sample"][k] = self.place.client.submit(edge_sample_task, self.lane_sample(lane, k), self.edge_rows,
                                                        key=f"edge-samples-{lane.refs[k].key}-{lane.tok}",
                                                        **self.place.cpu(k))
        return e.f["sample"][k]

    def _edge_plan(self, lane: Lane, k: int) -> None:
        """Plan k of lane's edge rows, chained on its plan of the latest share before k (submitted beside the
        node rows' plan k, so the same rules keep and release both)."""
        e = lane.edges
        if e is None or k in e.f["plan"]:
            return
        prev = next((e.f["plan"][j] for j in range(k - 1, self.start - 1, -1) if not lane.empty(j)), None)
        e.f["plan"][k] = e.graph.plan(k, prev, self.edge_sample(lane, k), self.edge_sample(lane, k + 1), e.tiers)

    def chains(self) -> list[Lane]:
        """The plan chains: each lane's own (``--cache per-worker``), or the shared tier's planner."""
        return [self.planner] if self.planner is not None else self.lanes

    def holders(self) -> list[Lane]:
        """Every lane and the shared tier's planner: what holds futures of the run."""
        return self.lanes + ([self.planner] if self.planner is not None else [])

    def chain_of(self, lane: Lane) -> Lane:
        return self.planner if self.planner is not None else lane

    def rank(self, r: int) -> Lane:
        return self.planner if r < 0 and self.planner is not None else self.lanes[r]

    def prepare(self, k: int, attempt: int = 0) -> None:
        """Prepare superbatch k on every chain (`prepare_chain`)."""
        for chain in self.chains():
            self.prepare_chain(chain, k, attempt)

    def prepare_chain(self, chain: Lane, k: int, attempt: int = 0, only: list[Lane] | None = None) -> None:
        """Submit plan k of `chain` (once), then pack and ship of every lane's share of it (`attempt` > 0: pack
        and ship again, for the lanes in `only`).

        Plan k (with its lookahead sample k+1) is submitted only once plan k-1 is done; until then
        k waits in `deferred`. A CPU worker runs whatever task it holds that is ready, so a sample
        submitted early would run ahead of pack k-1, whose plan had just finished but which the
        scheduler had not handed over yet; each such sample delays a ``ship`` by its whole duration.
        With more CPU workers, sampling runs ahead by one superbatch per extra worker (`_sample_lead`).
        A lane with no batch of superbatch k (fewer batches than GPU workers) has nothing to prepare.
        """
        if not attempt and k not in chain.f["plan"] and k > self.start and k - 1 not in chain.planned:
            chain.deferred.add(k)
            return
        chain.deferred.discard(k)
        for j in range(k + 2, k + 2 + self._sample_lead()):
            self.sample(j)
        if chain.empty(k):          # a lane's own chain, with no share of k
            chain.planned.add(k)
            self._pack_ship(chain, k, None)
            if k == self.start:
                self.open_window(chain)
            if k + 1 in chain.deferred:
                self.prepare_chain(chain, k + 1)
            return
        if k not in chain.f["plan"]:
            prev = chain.prev_plan(k, self.start)
            chain.f["plan"][k] = self.place.watched(chain.graph.plan(k, prev, self.lane_sample(chain, k),
                                                              self.lane_sample(chain, k + 1), chain.tiers,
                                                              chain.f["trace"].get(k)), "plan", k, chain.rank)
            self._edge_plan(chain, k)
            self._trace_ahead(chain, k + 1)
        if chain is self.planner:
            chain.prepared.add(k)
            chain.shipped_ok.add(k)     # (the planner ships nothing: its samples are no longer needed)
            if checkpoint_due(self.refs, k, self.start, self.cfg.checkpoint_every) and k not in self.final_ids:     # the tier a checkpoint after k saves
                self.final_ids[k] = self.place.client.submit(final_cache_task, chain.f["plan"][k],
                                                       key=f"final-cache-{self.refs[k].key}-{self.tok}", **self.place.cpu(k))
        for lane in only or ([chain] if chain is not self.planner else self.lanes):
            self._pack_ship(lane, k, chain.f["plan"][k], attempt)

    def _pack_ship(self, lane: Lane, k: int, plan: Any, attempt: int = 0) -> None:
        """Submit pack k of lane's share (from `plan`, its chain's) and its ship to lane's GPU worker; a lane with
        no share of k has nothing to ship, and its train joins the steps at once."""
        if lane.empty(k):
            lane.prepared.add(k)
            lane.shipped_ok.add(k)
            self.on_shipped(lane)
            return
        r, c = lane.refs[k], self.place.client
        suffix = f"-r{attempt}" if attempt else ""
        share = (lane.rank, self.gpus, self.refs[k].round_first_batch) if self.shared else None
        e = lane.edges
        edges = None if e is None else (e.table, self.edge_sample(lane, k), e.f["plan"][k], e.header)
        pack = self.place.watched(c.submit(
            pack_task, self.store_path, r, self.lane_sample(lane, k), plan, lane.header, k,
            self.cfg.stage, lane.run, share, edges, self.codec, key=f"pack-{r.key}{suffix}-{lane.tok}",
            **self.place.cpu(k)),
            "pack", k, lane.rank)
        lane.f["ship"][k] = self.place.watched(c.submit(
            ship_task, lane.run, pack, self.start, lane.ship_base, key=f"ship-{r.key}{suffix}-{lane.tok}",
            **on_gpu(lane, self.place.ship_priority(k), 0)), "ship", k, lane.rank)
        lane.prepared.add(k)

    def _trace_ahead(self, lane: Lane, k: int) -> None:
        """Trace superbatch k's window now, while plan k-1 runs, if its samples are already submitted.

        Submitting a sample early for it would put that sample ahead of a pack the GPU worker waits
        for (see `prepare_chain`); a plan whose window was not traced ahead traces it itself.
        """
        if k >= self.n or k in lane.f["trace"] or k in lane.f["plan"] or lane.empty(k):
            return
        if k in self.samples and (k + 1 >= self.n or k + 1 in self.samples):
            trace = lane.graph.trace(k, self.lane_sample(lane, k), self.lane_sample(lane, k + 1), lane.tiers)
            if trace is not None:
                lane.f["trace"][k] = trace

    def _sample_lead(self) -> int:
        """Superbatches sampling may run ahead of the plan chain's needs: one per CPU worker beyond the first,
        at most the window (so what is held in workers' memory stays bounded by the window)."""
        return min(max(0, len(self.place.cpu_addrs) - 1), self.cfg.window)


    def head(self, device_name: str) -> None:
        """Per lane: counts over the tier superbatches, the tiers, and the base bundle (pack-base, ship-base),
        for training on `device_name`."""
        c = self.place.client
        per_epoch0 = sum(1 for r in self.refs if r.epoch == 0)
        t = min(self.cfg.tier_superbatches, per_epoch0)
        kw = self.place.cpu(-1)
        cfg = self.cfg
        device = "cuda" if device_name.startswith("cuda") else "cpu"
        spec = TierSpec(cfg.gpu_memory, cfg.cpu_memory, device, cfg.staging_batches, cfg.io_reserve, cfg.gpu_policy,
                        cfg.cpu_policy, batch_size=cfg.batch_size, fanouts=as_fanouts(cfg.fanouts),
                        row_bytes=0 if self.codec is None else self.codec.row_bytes, staging_piece=cfg.staging_piece)
        config = {"fanouts": fanouts_json(cfg.fanouts), "batch_size": cfg.batch_size, "superbatch_size": cfg.superbatch_size,
                  "epochs": cfg.epochs, "seed": cfg.seed, "cpu_policy": policy_id(cfg.cpu_policy),
                  "gpu_memory": cfg.gpu_memory, "cpu_memory": cfg.cpu_memory, "device": device_name,
                  "staging_batches": cfg.staging_batches, "tier_superbatches": cfg.tier_superbatches,
                  **({"rows": cfg.rows} if cfg.rows != "exact" else {}),
                  **({"staging_piece": cfg.staging_piece} if cfg.staging_piece != STAGING_PIECE_BYTES else {})}
        if self.gpus > 1:
            config.update(gpus=self.gpus, cache=cfg.cache, lane=0)
        if self.planner is not None:        # one tier of every worker's share of the budget, planned once
            spec = replace(spec, pool=self.gpus)
        chains = self.chains()
        firsts = {chain.rank: [self.lane_sample(chain, k) for k in range(max(t, 2 if self.n > 1 else 1))]
                  for chain in chains}
        for chain in chains:            # with edge rows: the budgets split between the tables, per lane
            if chain.edges is not None:
                fs = firsts[chain.rank]
                chain.edges.split = c.submit(edge_split_task, self.store_path, chain.edges.table, fs[:t],
                                             [self.edge_sample(chain, k) for k in range(t)], cfg, spec,
                                             key=f"edge-split-{chain.tok}", **kw)
        for chain in chains:        # counts over its first superbatches, then its tiers
            fs = firsts[chain.rank]
            total = chain.graph.counts([(k, fs[k]) for k in range(t)])
            e: EdgeLane | None = chain.edges
            if e is not None:       # (a budget the two tables' buffers do not fit is refused here, in one line)
                e.split = e.split.result()
                efs = [self.edge_sample(chain, k) for k in range(len(fs))]
                e.tiers = e.graph.tiers(e.graph.counts([(k, efs[k]) for k in range(t)]), efs, e.split.edges,
                                        max_rows=None, whole_round=False, start_cpu_ids=e.start_ids)
            chain.tiers = self.place.watched(chain.graph.tiers(total, fs, spec if e is None else e.split.nodes,
                                                               max_rows=None, whole_round=False,
                                                               start_cpu_ids=chain.start_ids), "tiers", -1, chain.rank)
        for lane in self.lanes:
            lane.tiers = self.chain_of(lane).tiers
            if self.gpus > 1:
                config = {**config, "lane": lane.rank}
            e = lane.edges      # (the edge rows' chain: lanes are their own chains with edge rows)
            if e is not None:       # the edge rows' header: their own tiers and budgets
                e.header = c.submit(header_task, e.table, e.tiers, {**config, "gpu_memory": e.split.edges.gpu_memory,
                                                                    "cpu_memory": e.split.edges.cpu_memory},
                                    lane.round_batches, cfg.epochs, key=f"header-{lane.tok}e", **kw)
            lane.header = c.submit(header_task, self.store_path, lane.tiers, config, lane.round_batches, cfg.epochs,
                                   None if e is None else e.split.entry, self.codec, key=f"header-{lane.tok}", **kw)
            base = c.submit(pack_base_task, self.store_path, lane.tiers, self.cfg.stage, lane.run,
                            not self.shared or lane.rank == 0,      # a shared tier's rows: rank 0 fills it
                            None if e is None else (e.table, e.tiers), self.codec, key=f"pack-base-{lane.tok}", **kw)
            lane.ship_base = self.place.watched(c.submit(ship_task, lane.run, base, self.start, key=f"ship-base-{lane.tok}",
                                                  **on_gpu(lane, self.place.ship_priority(-1), 0)), "ship-base", -1,
                                         lane.rank)


    def open_window(self, lane: Lane) -> None:
        """Submit the preparation of the window's other superbatches (of one lane).

        Held back until the first superbatch's plan is done: until then the CPU workers are on
        the stream's critical path (samples, counts, tiers, the first plan), and a sample of a
        later superbatch that happens to be ready while one of those waits on the scheduler
        would delay the first ``train`` by its whole duration. The window is full long before
        the first superbatch has trained.
        """
        for k in range(self.start + 1, min(self.start + self.cfg.window, self.n)):
            if k not in lane.prepared:
                self.prepare_chain(lane, k)    # k = start + 1 now, the rest each when its previous plan is done

    def planned(self, chain: Lane, k: int) -> None:
        """Plan k of `chain` is done: open the window after the first, submit a plan k+1 that waited for it."""
        chain.planned.add(k)
        if k == self.start:
            self.open_window(chain)
        if k + 1 in chain.deferred:
            self.prepare_chain(chain, k + 1)

    def drop(self) -> None:
        """Let go of every future held (the run stops: what no client wants, the scheduler forgets)."""
        self.samples.clear()
        self.final_ids.clear()
        for lane in self.holders():
            for d in [*lane.f.values(), *(lane.edges.f.values() if lane.edges is not None else [])]:
                d.clear()
            lane.tiers = lane.ship_base = lane.header = None
            if lane.edges is not None:
                lane.edges.tiers = lane.edges.header = lane.edges.split = None
