"""docs/scaling.md's tables: the job at full scale, projected on paper from the rates the benchmarks measured.

Three public graphs (`GRAPHS`: ogbn-papers100M, MAG240M, IGB-260M), each with its feature rows stored exact or
encoded (`ENCODINGS`, through `operators.formats.rowcodec.make_codec`, so the row sizes are the codec's own), are
projected with rates read from ``docs/results/*.json`` (`load_rates`; every rate names its file and key) and
with the shape of the runs that measured them (the benches' own defaults, which their commands did not change):

    store        feature rows x row bytes + indptr (8 bytes a node) + indices (2 x the published edges, stored
                 undirected, 4 bytes each below 2**31 nodes) + labels and splits (9 bytes a node)
    packs        training nodes x packed rows per training node per epoch x row bytes, plus half a page of
                 alignment per (batch, shard) segment; a stream's scratch disk holds the CPU tier, the labels
                 and the window's superbatches (window + 1, the one training included)
    disk time    packs written to the scratch disk at the disk's bandwidth, read back by the loader at the
                 measured fraction of it, and the missed rows' pages read from the share of the store the
                 page cache does not hold, at the measured random-read fraction
    GPU worker   feature accesses / the GPU worker's measured accesses per second
    prepare      feature accesses / the measured accesses per CPU second; CPU workers = the CPU seconds over
                 the GPU worker's pace (the larger of its disk time and its own time)
    epoch        the measured stream / max(prepare, train) ratio x the largest of the disk time, the GPU
                 worker's time and the CPU seconds spread over the box's CPU workers (on one box: `Box`,
                 the store on its disk); or, with the store in the RAM of separate CPU machines and enough
                 CPU workers there, x the larger of the packs' disk time and the GPU worker's time

``python -m diskflow.bench.scaling`` rewrites the text between `BEGIN` and `END` in docs/scaling.md;
``--check`` rewrites nothing and exits 1 when the text there differs from what the JSONs give (a test runs the
same comparison, so the tables cannot drift from the JSONs they cite).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..flow.stream.config import StreamConfig
from ..operators.formats.rowcodec import RowCodec, make_codec
from ..operators.ingest.edges import INDEX32_LIMIT
from ..operators.ingest.raw import MAX_SHARD_BYTES
from ..operators.options import CPU_SHARE
from .results import ResultsError, write_generated
from .results import splice as splice_page

__all__ = ["BEGIN", "DISK_BANDWIDTHS", "DOC", "ENCODINGS", "END", "GRAPHS", "PAGE", "RESERVE", "RESULTS", "ROOT",
           "Box", "Epoch", "Graph", "Rate", "Rates", "ScalingError", "Storage", "bench_shape", "epoch", "load_rates",
           "main", "pages_per_row", "render", "splice", "storage"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
DOC = ROOT / "docs" / "scaling.md"
BEGIN, END = "<!-- scaling:begin -->", "<!-- scaling:end -->"

ENCODINGS = ("exact", "float16", "int8")       # bfloat16 has float16's size; int8 with a float32 scale per row
DISK_BANDWIDTHS = (2e9, 6e9)                   # the GPU worker's local disk, sequential read, bytes/s
PAGE = 4096                                    # the page a store read faults in; packed segments align to it
RESERVE = 16 << 30                             # the box's memory kept for the processes themselves
LABEL_BYTES = 8 + 1                            # labels.npy int64 + splits.npy uint8, per node
INDPTR_BYTES = 8                               # indptr.npy int64, per node (+1)


class ScalingError(Exception):
    """A results file or docs/scaling.md is not as the projection expects; the message names the file."""


@dataclass(frozen=True)
class Graph:
    """One public graph, as published (see docs/scaling.md for the sources and what is assumed).

    Attributes:
        name: the graph's name.
        nodes: every node (the topology's indptr spans them).
        rows: the nodes that carry a feature row (MAG240M: the papers only).
        dim: values per row.
        dtype: the published rows' dtype (float32 or float16).
        edges: the published edge count (directed); the store holds them undirected, twice.
        train: training nodes per epoch.
        train_note: where the training count comes from.
        edges_note: how the edge count is given, where it is not the exact published one.
    """

    name: str
    nodes: int
    rows: int
    dim: int
    dtype: str
    edges: int
    train: int
    train_note: str
    edges_note: str = ""


GRAPHS = (
    Graph("ogbn-papers100M", 111_059_956, 111_059_956, 128, "float32", 1_615_685_872, 1_207_179,
          "OGB's train split"),
    # 121,751,666 papers + 122,383,112 authors + 25,721 institutions; cites 1,297,748,926 + writes 386,022,720
    # + affiliated with 44,592,586 edges
    Graph("MAG240M", 244_160_499, 121_751_666, 768, "float16", 1_728_364_232, 1_112_392,
          "OGB-LSC's train papers"),
    # IGB's loader for the full graph: 227,130,858 labelled nodes (19 classes), the first 60% train
    Graph("IGB-260M", 269_346_174, 269_346_174, 1024, "float32", 4_000_000_000, 136_278_514,
          "IGB's loader: 60% of the 227,130,858 labelled nodes", "about 4.0 billion, rounded up"),
)


@dataclass(frozen=True)
class Rate:
    """One measured figure: its value, what it is, and where it was read."""

    name: str
    value: float
    shown: str                  # the value as the table prints it
    source: str                 # file and key path, and how the value was derived from them
    measured: str               # machine, date, commit


@dataclass(frozen=True)
class Box:
    """The machine the projection runs the whole job on: one GPU worker, the CPU workers, one local disk."""

    cores: int
    ram: int                    # bytes
    source: str

    @property
    def cpu_workers(self) -> int:
        """CPU workers the box runs beside its GPU worker: a core each for the GPU worker and the scheduler."""
        return self.cores - 2


@dataclass(frozen=True)
class Rates:
    """The rates the projection uses (`load_rates`), each a `Rate`."""

    accesses: Rate              # feature accesses per training node per epoch
    prepare: Rate               # feature accesses per CPU second of preparation
    packed: Rate                # packed rows per training node per epoch
    loader: Rate                # the loader's read rate / the disk's sequential read bandwidth
    random: Rate                # random 4 KiB reads at depth 64 x 4 KiB / the sequential read bandwidth
    gpu: Rate                   # feature accesses per second of the GPU worker, streaming
    stream: Rate                # a streamed run / max(prepare, train)
    box: Box

    def all(self) -> tuple[Rate, ...]:
        return (self.accesses, self.packed, self.prepare, self.gpu, self.loader, self.random, self.stream)


def _load(results: Path, name: str) -> dict[str, Any]:
    path = results / name
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ScalingError(f"{path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("figures"), dict):
        raise ScalingError(f"{path}: expected a JSON object with figures")
    return data


def _figure(data: dict[str, Any], name: str, key: str) -> Any:
    value: Any = data["figures"]
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ScalingError(f"{name}: no figures.{key}")
        value = value[part]
    return value


def _range(text: Any, name: str, key: str) -> float:
    """The middle of a range written as "1.2-1.3" or "70k-78k" (a number is itself)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    m = re.fullmatch(r"([\d.]+)(k?)-([\d.]+)(k?)", str(text))
    if not m:
        raise ScalingError(f"{name}: figures.{key} = {text!r} is not a range such as 70k-78k")
    lo, hi = (float(m[i]) * (1e3 if m[i + 1] else 1.0) for i in (1, 3))
    return (lo + hi) / 2


def _measured(data: dict[str, Any]) -> str:
    commit = f", `{data['commit']}`" if data.get("commit") else ""
    return f"{data['machine']}; {data['date']}{commit}"


def _expect(data: dict[str, Any], name: str, field: str, *texts: str) -> None:
    """Refuse a results file whose run was not the shape the projection assumes (its setup text says it)."""
    have = str(data.get(field, ""))
    missing = [t for t in texts if t not in have]
    if missing:
        raise ScalingError(f"{name}: its {field} does not say {missing}: the run is not the shape projected from")


def bench_shape(bench: str) -> dict[str, Any]:
    """The defaults of `diskflow bench NAME` (compare or prepare): the graph and the round the results measured."""
    from . import compare, prepare

    modules = {"compare": compare, "prepare": prepare}
    p = argparse.ArgumentParser()
    modules[bench].add_arguments(p)
    args = p.parse_args([])
    row_bytes = int(args.dim) * np.dtype(args.dtype).itemsize
    return {"nodes": int(args.nodes), "train": round(args.nodes * args.train_frac), "train_frac": args.train_frac,
            "row_bytes": row_bytes,
            "epochs": int(args.epochs), "batch_size": int(args.batch_size), "fanouts": tuple(args.fanouts),
            "dim": int(args.dim), "dtype": str(args.dtype)}


_SHAPE_OPTIONS = ("--nodes", "--dim", "--dtype", "--train-frac", "--epochs", "--batch-size", "--fanouts",
                  "--feature-budget", "--avg-degree", "--dataset")


def load_rates(results: Path = RESULTS) -> Rates:
    """The rates of docs/scaling.md, read from the JSONs in `results`.

    Raises:
        ScalingError: a file or key missing, or a run whose command or setup is not the benches' default shape.
    """
    files = {n: _load(results, f"{n}.json") for n in ("compare", "prepare", "reader", "stream.h200")}
    for n in ("compare", "prepare"):
        changed = [o for o in _SHAPE_OPTIONS if o in str(files[n].get("command", ""))]
        if changed:
            raise ScalingError(f"{n}.json: its command sets {changed}: not the default shape projected from")
    cmp, prep = bench_shape("compare"), bench_shape("prepare")
    if any(cmp[k] != prep[k] for k in ("nodes", "train", "dim", "dtype", "fanouts", "batch_size")):
        raise ScalingError(f"the compare and prepare benches' defaults differ ({cmp} / {prep}): their rates do not "
                           f"combine")
    graph = f"{cmp['nodes'] / 1e6:.1f}M nodes x {cmp['dim']} {cmp['dtype']}"
    _expect(files["compare"], "compare.json", "setup", graph, f"fanouts {','.join(map(str, cmp['fanouts']))}",
            f"batch {cmp['batch_size']}", f"{cmp['epochs']} epochs", f"({CPU_SHARE:.0%})")
    _expect(files["prepare"], "prepare.json", "setup", graph, f"CPU budget {CPU_SHARE:.0%}")
    train = cmp["train"]

    pf, cf = "prepare.json", "compare.json"
    accesses = float(_figure(files["prepare"], pf, "feature_accesses"))
    per_node = accesses / (prep["train"] * prep["epochs"])
    gib = float(_figure(files["compare"], cf, "belady_bytes_per_round_gib"))
    packed = gib * (1 << 30) / cmp["row_bytes"] / (train * cmp["epochs"])
    seq = _range(_figure(files["reader"], "reader.json", "sequential_gb_s"), "reader.json", "sequential_gb_s")
    iops = _range(_figure(files["reader"], "reader.json", "random_4k_iops_depth_64"), "reader.json",
                  "random_4k_iops_depth_64")
    detail = str(files["stream.h200"].get("machine_detail", ""))
    cores, ram = re.search(r"(\d+)-core box", detail), re.search(r"([\d.]+) GiB of RAM", detail)
    if not (cores and ram):
        raise ScalingError("stream.h200.json: machine_detail names no 'N-core box' and 'N GiB of RAM'")
    shape = (f"{graph}, {prep['nodes']:,} x {prep['train_frac']:g} training nodes, fanouts "
             f"{','.join(map(str, cmp['fanouts']))}, batch {cmp['batch_size']}")
    sh = files["stream.h200"]
    gpu = float(_figure(sh, "stream.h200.json", "trainer_accesses_per_s_streaming"))
    ratio = float(_figure(sh, "stream.h200.json", "stream_vs_max"))
    loader = float(_figure(files["compare"], cf, "loader_vs_disk"))
    rate = float(_figure(files["prepare"], pf, "accesses_per_cpu_s"))
    return Rates(
        accesses=Rate("feature accesses per training node per epoch", per_node, f"{per_node:.0f}",
                      f"{pf} `figures.feature_accesses` ({accesses / 1e6:.1f}M) / {prep['train']:,} training nodes "
                      f"/ {prep['epochs']} epoch ({shape})", _measured(files["prepare"])),
        packed=Rate("packed (missed) rows per training node per epoch", packed, f"{packed:.0f}",
                    f"{cf} `figures.belady_bytes_per_round_gib` ({gib} GiB) / {cmp['row_bytes']} bytes a row / "
                    f"{train:,} training nodes / {cmp['epochs']} epochs (the same shape; CPU tier "
                    f"{CPU_SHARE:.0%} of the features, no GPU tier)", _measured(files["compare"])),
        prepare=Rate("preparation: feature accesses per CPU second", rate, f"{rate / 1e6:.2f}M",
                     f"{pf} `figures.accesses_per_cpu_s` (sample, plan and pack, {cmp['row_bytes']}-byte rows: "
                     f"{rate * cmp['row_bytes'] / 1e9:.2f} GB of rows per CPU second)", _measured(files["prepare"])),
        gpu=Rate("GPU worker: feature accesses per second, streaming", gpu, f"{gpu / 1e6:.2f}M",
                 "stream.h200.json `figures.trainer_accesses_per_s_streaming` (100k nodes x 16, GraphSAGE hidden 4, "
                 "on CUDA)", _measured(sh)),
        loader=Rate("loader's read rate / the disk's sequential read", loader, f"{loader:.3f}",
                    f"{cf} `figures.loader_vs_disk` ({_figure(files['compare'], cf, 'loader_mib_s')} / "
                    f"{_figure(files['compare'], cf, 'disk_mib_s')} MiB/s)", _measured(files["compare"])),
        random=Rate("random 4 KiB reads / the sequential read, in bytes", iops * PAGE / (seq * 1e9),
                    f"{iops * PAGE / (seq * 1e9):.3f}",
                    f"reader.json `figures.random_4k_iops_depth_64` ({iops / 1e3:.0f}k, the middle of the range) x "
                    f"4096 / `figures.sequential_gb_s` ({seq:g} GB/s, the middle)", _measured(files["reader"])),
        stream=Rate("streamed run / max(prepare, train)", ratio, f"{ratio:.2f}",
                    "stream.h200.json `figures.stream_vs_max`", _measured(sh)),
        box=Box(int(cores[1]), int(float(ram[1]) * (1 << 30)),
                f"stream.h200.json `machine_detail`: {cores[0]}, {ram[0]}"),
    )


# ---------------------------------------------------------------------------------------------- the projection

def pages_per_row(row_bytes: int) -> float:
    """Pages a random row's read faults in, on average: rows lie back to back from a page boundary, so a row
    starts at a multiple of gcd(row_bytes, PAGE) within its page and spans ``1 + (row_bytes - gcd) / PAGE``."""
    return 1 + (row_bytes - math.gcd(row_bytes, PAGE)) / PAGE


@dataclass(frozen=True)
class Storage:
    """What one graph at one encoding takes: bytes on disk and in memory."""

    graph: Graph
    codec: RowCodec
    features: int               # the store's feature rows
    topology: int               # indptr + indices
    labels: int                 # labels + splits
    shards: int
    packs: float                # packed bytes per epoch
    scratch: float              # a stream's scratch disk at its fullest
    tier: float                 # the CPU tier at the benches' share of the features
    ram_min: float              # tier + topology + RESERVE: what the box must hold
    cached: float               # the share of the store's features the page cache holds beside that (0 to 1)
    batches: int

    @property
    def store(self) -> int:
        return self.features + self.topology + self.labels


def storage(g: Graph, encoding: str, rates: Rates) -> Storage:
    """The store, the packs and the memory of `g` with its rows encoded as `encoding` (`ENCODINGS`)."""
    codec = make_codec(encoding, g.dim, g.dtype)
    rb = codec.row_bytes
    features = g.rows * rb
    index = 4 if g.nodes < INDEX32_LIMIT else 8
    topology = INDPTR_BYTES * (g.nodes + 1) + 2 * g.edges * index
    labels = LABEL_BYTES * g.nodes
    shards = math.ceil(g.rows / (MAX_SHARD_BYTES // rb))
    batch = StreamConfig.batch_size
    batches = math.ceil(g.train / batch)
    padding = shards * PAGE / 2                                 # per batch: half a page per shard's segment
    packs = g.train * rates.packed.value * rb + batches * padding
    tier = CPU_SHARE * features
    # the scratch disk: the base bundle (the CPU tier's first rows, the labels) and the window's superbatches,
    # the staged ones and the one training
    window = (StreamConfig.window + 1) * StreamConfig.superbatch_size * (batch * rates.packed.value * rb + padding)
    ram_min = tier + topology + RESERVE
    cached = min(1.0, max(0.0, (rates.box.ram - ram_min) / features))
    return Storage(g, codec, features, topology, labels, shards, packs, tier + 8 * g.nodes + window,
                   tier, ram_min, cached, batches)


@dataclass(frozen=True)
class Epoch:
    """One epoch of one graph at one encoding with one GPU worker whose local disk reads `bandwidth` bytes/s:
    on the box (`Box`: the CPU workers, the store and the scratch disk on it) and, beside it, with the store in
    the RAM of separate CPU machines (the GPU worker's disk then holds the packs alone)."""

    storage: Storage
    bandwidth: float
    accesses: float             # feature accesses
    packs_s: float              # the packs written to the scratch disk and read back by the loader
    store_reads: float          # bytes of the store's pages read on the box (the share not in its page cache)
    store_s: float
    gpu_s: float                # the GPU worker's own time
    cpu_s: float                # CPU seconds of preparation
    box_workers: int            # CPU workers that keep pace with the GPU worker on the box
    box_s: float                # the epoch on the box
    box_limit: str
    workers: int                # CPU workers that keep pace with it when the store is in CPU machines' RAM
    split_s: float              # the epoch then
    split_limit: str

    @property
    def disk_s(self) -> float:
        """The box's disk: the packs and the store's pages."""
        return self.packs_s + self.store_s


def _bound(times: dict[str, float]) -> str:
    return max(times, key=lambda k: times[k])


def epoch(s: Storage, bandwidth: float, rates: Rates) -> Epoch:
    """One epoch of `s` with a GPU worker's disk of `bandwidth` bytes/s (the module docstring's model)."""
    g, rb = s.graph, s.codec.row_bytes
    accesses = g.train * rates.accesses.value
    misses = g.train * rates.packed.value
    reads = (1 - s.cached) * misses * pages_per_row(rb) * PAGE
    packs_s = s.packs / bandwidth + s.packs / (bandwidth * rates.loader.value)
    store_s = reads / (bandwidth * rates.random.value)
    gpu_s = accesses / rates.gpu.value
    cpu_s = accesses / rates.prepare.value
    box = {"disk": packs_s + store_s, "GPU worker": gpu_s,
           f"CPU ({rates.box.cpu_workers} workers)": cpu_s / rates.box.cpu_workers}
    bound = _bound(box)
    box_limit = ("disk: store reads" if store_s > packs_s else "disk: packs") if bound == "disk" else bound
    if s.ram_min > rates.box.ram:
        box_limit = f"RAM: {_bytes(s.ram_min)} needed"
    split = {"disk: packs": packs_s, "GPU worker": gpu_s}
    pace = max(split.values())
    return Epoch(s, bandwidth, accesses, packs_s, reads, store_s, gpu_s, cpu_s,
                 math.ceil(cpu_s / max(box["disk"], gpu_s)), rates.stream.value * box[bound], box_limit,
                 math.ceil(cpu_s / pace), rates.stream.value * pace, _bound(split))


# ---------------------------------------------------------------------------------------------- rendering

def _bytes(n: float) -> str:
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}" if n / scale < 100 else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


def _seconds(s: float) -> str:
    if s < 100:
        return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"
    if s < 600:
        return f"{s / 60:.1f} min"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def render(rates: Rates) -> str:
    """The generated part of docs/scaling.md: the rates with their sources, then the two tables."""
    out = ["The graphs:", ""]
    out += _table(("graph", "nodes", "feature rows", "row", "edges (published)", "training nodes"),
                  [(g.name, f"{g.nodes:,}", f"{g.rows:,}", f"{g.dim} {g.dtype}", g.edges_note or f"{g.edges:,}",
                    f"{g.train:,} ({g.train_note})") for g in GRAPHS])
    out += ["", "Rates (the JSON key each is read from; the files are in [results/](results)):", ""]
    out += _table(("rate", "value", "from", "measured on"),
                  [(r.name, r.shown, r.source, r.measured) for r in rates.all()])
    box = rates.box
    out += ["", (f"The box: {box.cores} cores ({box.cpu_workers} CPU workers beside the GPU worker and the "
                 f"scheduler), {box.ram / (1 << 30):.0f} GiB of RAM ({box.source}), one local disk; "
                 f"{RESERVE >> 30} GiB of the RAM kept for the processes."), ""]
    stores = [storage(g, e, rates) for g in GRAPHS for e in ENCODINGS]
    out += ["Disk and memory:", ""]
    out += _table(("graph", "rows", "bytes a row", "vs exact", "store: features", "topology, labels", "store",
                   "packs, one epoch", "stream scratch", "CPU tier", "store in page cache"),
                  [(s.graph.name, s.codec.encoding, f"{s.codec.row_bytes:,}", f"{s.codec.ratio:.2f}x",
                    _bytes(s.features), _bytes(s.topology + s.labels), _bytes(s.store), _bytes(s.packs),
                    _bytes(s.scratch), _bytes(s.tier), f"{s.cached:.0%}") for s in stores])
    epochs = [epoch(s, bw, rates) for s in stores for bw in DISK_BANDWIDTHS]
    out += ["", (f"One epoch on the box ({box.cpu_workers} CPU workers at most; the store and the scratch share "
                 "its disk):"), ""]
    out += _table(("graph", "rows", "disk", "packs written and read", "store reads", "GPU worker",
                   "prepare, CPU time", "CPU workers to keep pace", "epoch", "first limit"),
                  [(e.storage.graph.name, e.storage.codec.encoding, f"{e.bandwidth / 1e9:g} GB/s",
                    _seconds(e.packs_s), f"{_bytes(e.store_reads)}: {_seconds(e.store_s)}" if e.store_reads else "—",
                    _seconds(e.gpu_s), _seconds(e.cpu_s), str(e.box_workers), _seconds(e.box_s), e.box_limit)
                   for e in epochs])
    out += ["", ("One epoch with the store in the RAM of separate CPU machines (the GPU worker's disk holds "
                 "the packs alone):"), ""]
    out += _table(("graph", "rows", "disk", "RAM for the store", "CPU workers to keep pace", "epoch", "first limit"),
                  [(e.storage.graph.name, e.storage.codec.encoding, f"{e.bandwidth / 1e9:g} GB/s",
                    _bytes(e.storage.store), str(e.workers), _seconds(e.split_s), e.split_limit) for e in epochs])
    return "\n".join(out)


def splice(doc: str, text: str, where: str = "docs/scaling.md") -> str:
    """`doc` with the text between `BEGIN` and `END` replaced by `text` (`results.splice`)."""
    try:
        return splice_page(doc, text, where, (BEGIN, END))
    except ResultsError as e:
        raise ScalingError(str(e)) from None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diskflow.bench.scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 when docs/scaling.md's tables differ from what the JSONs give")
    p.add_argument("--doc", type=Path, default=DOC, help="the page (default: docs/scaling.md)")
    p.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: docs/results)")
    args = p.parse_args(argv)
    try:
        old = args.doc.read_text()
        new = splice(old, render(load_rates(args.results)), str(args.doc))
    except (OSError, ScalingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return write_generated(args.doc, old, new, check=args.check, what="the tables", source=args.results,
                           command="python -m diskflow.bench.scaling")


if __name__ == "__main__":
    sys.exit(main())
