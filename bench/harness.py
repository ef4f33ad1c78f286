"""The training child of the pipeline benches: one pipeline's runs in a process of its own, measured from
inside, and the memory that process is given.

`diskflow bench compare` runs each pipeline's data-path and model runs as ``python -m diskflow.bench.harness
--child SPEC`` (`launch`, `child_main`; `bench.child` carries the spec in and the figures out, `bench.cgroup`
the memory limit). Before every run the child evicts the store's and the packed datasets' files from the page
cache (`common.drop_trees`); it reads each epoch's sample files once before the epoch's clock and disk counter
start, times every epoch and reads its ``/proc/self/io`` from inside, and writes its figures after every run it
finishes, so a later failure (an OOM kill, a timeout, settings it refused) keeps the runs before it.

A child's cgroup limit is the feature budget plus an allowance for the process itself (`allowance`): the peak
RSS of a probe child (``"pipeline": "probe"``: torch and PyG imported, the labels and every stored sample
loaded, then the model's forward and backward on the largest batch) plus `ALLOWANCE_MARGIN`, plus the
assembled batches the trainer holds beyond the probe's, rounded up to `ALLOWANCE_ROUND`. `budget_fit` splits
the feature budget as the trainer will. `diskflow bench scale` measures its train phase's allowance the same
way, with the same probe.
"""
from __future__ import annotations

import os
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, DiskflowError, InputError
from ..operators.formats.sizes import format_bytes
from .child import child_failure, launch_child, read_child_spec, refuse, write_child_out
from .common import drop_page_cache, drop_trees, sequential_read_bw

__all__ = ["ALLOWANCE_MARGIN", "ALLOWANCE_ROUND", "CHILD", "Allowances", "allowance", "budget_fit", "child_main", "launch",
           "peak_rss", "probe_allowances", "reset_peak_rss", "samples_files", "seq_read_bw", "useful_bytes", "warm_files"]

CHILD = "diskflow.bench.harness"     # the module a child process runs (``python -m CHILD --child SPEC``)
ALLOWANCE_MARGIN = 0.25              # on top of the probe's peak RSS
ALLOWANCE_ROUND = 16 << 20           # the allowance is rounded up to this
_WARM_CHUNK = 8 << 20                # read size when warming sample files


def budget_fit(store: Any, budget: int, max_rows: int, queue_depth: int, piece: int | None = None) -> dict[str, int]:
    """The feature budget split into staging buffers (of at most `piece` row bytes each; None: the trainer's
    default), I/O buffers and CPU tier, or the smallest budget that works.

    Also the assembled batches the CPU trainer holds besides (each the whole largest batch): they are the
    training step's input, not features kept for later, and the cgroup's allowance carries them.
    """
    from ..operators.prepare.tiers import STAGING_PIECE_BYTES, staging_piece_bytes
    from ..operators.train.memory import io_buffer_bytes
    from ..operators.trainbuffers import assembled_batches, staging_count

    buffers = staging_count("cpu", queue_depth, False)
    piece = staging_piece_bytes(max_rows, store.row_bytes, len(store.shards),
                                STAGING_PIECE_BYTES if piece is None else piece)
    staging = buffers * piece
    io = io_buffer_bytes()
    tier = budget - staging - io
    if tier <= 0:
        share = budget / store.feature_bytes
        raise ConfigError("--feature-budget", (
            f"{format_bytes(budget)} ({share:.1%} of the {format_bytes(store.feature_bytes)} of features) cannot hold "
            f"the trainer's {buffers} staging buffers of {format_bytes(piece)} ({format_bytes(staging)}) and "
            f"{format_bytes(io)} of I/O buffers with any CPU tier; the smallest budget that works is "
            f"{format_bytes(staging + io + store.row_bytes)}"))
    return {"staging_buffers": buffers, "staging_piece_bytes": piece, "staging_bytes": staging,
            "io_buffer_bytes": io, "cpu_tier_bytes": tier, "assembled_batches": assembled_batches(queue_depth),
            "assembled_batch_bytes": max_rows * store.row_bytes}


def allowance(rss: int, held: int) -> int:
    """A cgroup allowance: a probe's peak RSS plus the margin, plus bytes the probe did not hold, rounded up."""
    return -(-(int(rss * (1 + ALLOWANCE_MARGIN)) + held) // ALLOWANCE_ROUND) * ALLOWANCE_ROUND


# ---------------------------------------------------------------------------- the child process

@dataclass(frozen=True)
class Allowances:
    """What the runs may hold beyond the feature budget: the model runs' and the data paths' allowances, and
    the probe's peak RSS of each (None where the allowance was given)."""

    model: int
    data: int
    probe_rss: int | None = None
    data_rss: int | None = None

    def limits(self, budget: int, no_cgroup: bool) -> dict[str, int | None]:
        """The cgroup limit of each kind of run (``data``, ``model``): its allowance plus `budget`."""
        return {"data": None if no_cgroup else self.data + budget, "model": None if no_cgroup else self.model + budget}


def probe_allowances(shared: dict[str, Any], work: Path, fit: dict[str, int], given: str | None, timeout: float,
                     where: Path, what: str = "the allowance probe") -> Allowances:
    """The benches' memory rule: a probe child's peak RSS plus `ALLOWANCE_MARGIN`, plus the assembled batches the
    trainer holds beyond the probe's (`fit`: `budget_fit`'s), for model runs and data paths apart; or the
    allowance `given` (a size, ``--allowance``) for both.

    Raises:
        InputError: (`where`) the probe, run in `work`, failed (`what` names it).
    """
    if given is not None:
        from ..operators.formats.sizes import parse_bytes

        both = parse_bytes(given, "--allowance")
        return Allowances(both, both)
    probe = launch({**shared, "pipeline": "probe"}, work, None, timeout)
    if "error" in probe:
        raise InputError(where, f"{what} failed ({probe['error']})")
    probe_rss, data_rss = int(probe["peak_rss_bytes"]), int(probe["data_peak_rss_bytes"])
    pool = fit["assembled_batches"] * fit["assembled_batch_bytes"]
    return Allowances(allowance(probe_rss, pool - fit["assembled_batch_bytes"]),    # the probe holds one batch
                      allowance(data_rss, pool), probe_rss, data_rss)


def launch(spec: dict[str, Any], work: Path, limit: int | None, timeout: float) -> dict[str, Any]:
    """Run one child (`child_main`) with `spec` in a cgroup of `limit` bytes (None: none); its figures.

    The child writes its figures after every run it finishes, so the runs done before a failure
    (an OOM kill, a timeout, settings it refused: its one-line reason) are kept; the failure is the
    ``error`` of the runs it did not finish.
    """
    name = spec["pipeline"] + (f"-{spec['group']}" if spec.get("group") else "")
    r, out, refused = launch_child(CHILD, work / "runs", name, spec, limit, timeout)
    result: dict[str, Any] = out if out is not None else {"runs": {}}
    result.update(returncode=r.returncode, wall_s=r.wall_s, process_read_bytes=r.read_bytes,
                  cgroup_peak_bytes=r.cgroup_peak_bytes, oom_kills=r.oom_kills, limit_bytes=r.limit_bytes,
                  cgroup=r.cgroup)
    if r.returncode != 0:
        result["error"] = child_failure(r, limit, timeout, refused)
        for run in spec.get("runs", []):
            result["runs"].setdefault(run["kind"], {"error": result["error"]})
    return result


def child_main(argv: list[str]) -> int:
    """Entry of a child process: ``--child SPEC`` (see `launch`); writes its figures to the spec's ``out``.
    Settings its pipeline refuses (a `DiskflowError`) end it with their one-line reason (`child.refuse`)."""
    spec = read_child_spec(argv, CHILD)
    if spec is None:
        return 2
    try:
        return _child_runs(spec)
    except DiskflowError as e:
        return refuse(spec, e)


def _child_runs(spec: dict[str, Any]) -> int:
    """The child's work: the allowance probe, or the spec's runs one after another."""
    if spec["pipeline"] == "probe":
        write_child_out(spec, _probe(spec))
        return 0
    from .cgroup import current_procs, find_hierarchy

    hierarchy = find_hierarchy() if spec.get("home_procs") else None
    mine = current_procs(hierarchy) if hierarchy is not None else None     # this child's cgroup, to come back to
    result: dict[str, Any] = {"runs": {}}
    for run in spec["runs"]:
        if mine is not None:
            mine.write_text(str(os.getpid()))
        drop_trees([Path(p) for p in spec["drop"]])
        result["runs"][run["kind"]] = _train(spec, run)
        write_child_out(spec, result)
    return 0


def peak_rss() -> int:
    """This process's peak RSS (``VmHWM``), in bytes.

    Not ``ru_maxrss``: that keeps the peak of the image before ``exec``, i.e. of the forking
    parent. `reset_peak_rss` lowers it to the current RSS, so each run reports its own peak.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _probe(spec: dict[str, Any]) -> dict[str, Any]:
    """What the process itself needs: torch and PyG imported, labels and every stored sample loaded (the
    data path's own memory), then a forward and backward pass of the model on the largest batch (features
    zero; a model run's)."""
    import torch

    from ..flow.runtimes import memory as inmemory  # noqa: F401
    from ..operators.formats.packed import PackedDataset
    from ..operators.train.batches import batch_data
    from ..operators.train.loop import deterministic, forward
    from ..operators.train.models import build_model
    from ..operators.train.trainer import train_packed  # noqa: F401  (what a run imports)

    ds = PackedDataset(spec["samples"])
    labels = np.load(ds.path / str(ds.manifest["labels"]))
    held: list[Any] = []
    largest: Any = None
    for sb in ds.superbatches:
        for s in ds.samples(sb.key):
            s.n_id = np.array(s.n_id)
            held.append(s)
            if largest is None or s.n_id.shape[0] > largest.n_id.shape[0]:
                largest = s
    data_rss = peak_rss()
    torch.manual_seed(0)
    net = build_model(spec.get("model", "sage"), ds.dim, spec["hidden"], int(ds.manifest["num_classes"]),
                      len(spec["fanouts"]))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    n = int(largest.n_id.shape[0])
    data = batch_data(largest, torch.zeros((n, ds.dim)), torch.from_numpy(labels[largest.n_id]))
    with deterministic():
        for _ in range(2):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(forward(net, data), data.y[:data.batch_size])
            loss.backward()
            opt.step()
    return {"peak_rss_bytes": peak_rss(), "data_peak_rss_bytes": data_rss, "largest_batch_rows": n,
            "samples_held": len(held)}


def seq_read_bw(store: Any, nbytes: int) -> tuple[float, int]:
    """O_DIRECT sequential read bandwidth over the store's shard files, each evicted from the page cache
    before it is read, up to `nbytes` in all: (bytes/s, bytes read). The disk's floor the benchmarks report."""
    done, seconds = 0, 0.0
    for s in store.shards:
        if done >= nbytes:
            break
        size = min(s.path.stat().st_size, nbytes - done)
        drop_page_cache(s.path)
        bw = sequential_read_bw(s.path, max_bytes=size)
        done += size
        seconds += size / bw
    return (done / seconds if seconds > 0 else float("nan")), done


def samples_files(packed: Path) -> dict[int, list[Path]]:
    """The stored sample files of a packed dataset, per epoch, in training order."""
    from ..operators.formats.packed import PackedDataset, samples_name

    with PackedDataset(packed) as ds:
        files: dict[int, list[Path]] = {}
        for sb in sorted(ds.superbatches, key=lambda s: s.first_batch):
            files.setdefault(sb.epoch, []).append(ds.round_dir / samples_name(sb.key))
    return files


def useful_bytes(packed: Path) -> np.ndarray:
    """Per batch of the round (global order), the bytes its plan reads from disk: packed, disk-cache, store rows."""
    from ..operators.formats.packed import SRC_PACKED, PackedDataset

    with PackedDataset(packed) as ds:
        useful = np.zeros(ds.num_batches, np.int64)
        for _, rec in ds.batches():
            useful[rec.batch] = int(np.count_nonzero(rec.src >= SRC_PACKED)) * ds.row_bytes
    return useful


class _Enough(Exception):
    """Raised from the batch hook once the batches to measure are done (a cut-short baseline)."""


def warm_files(paths: list[str]) -> int:
    """Read files once (into the page cache, charged to this process's cgroup); the bytes read."""
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(_WARM_CHUNK):
                total += len(chunk)
    return total


def _train(spec: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One training (or data-path) run, timing each epoch and its /proc/self/io from inside.

    After the last batch of a model run the process goes back to its parent's cgroup (when it
    has one) before the trainer evaluates: evaluation is no part of the measured epochs.
    """
    from .prepare import proc_io

    warmup, measure = spec.get("measure") or (0, 0)     # cut short: batches [warmup, warmup + measure) only
    st: dict[str, Any] = {"epochs": [], "partial": None, "count": 0, "n": 0, "epoch": 0, "train_peak_rss_bytes": None}

    def on_start(epoch: int, batches: int) -> None:
        warm_files(spec["warm"][str(epoch)])
        st.update(epoch=epoch, n=batches, count=0, io0=proc_io(), t0=time.perf_counter())

    def snapshot() -> dict[str, Any]:
        io = proc_io()
        return {"epoch": st["epoch"], "batches": st["count"], "seconds": time.perf_counter() - st["t0"],
                "first_batch_s": st.get("first_batch_s"),
                "read_bytes": io["read_bytes"] - st["io0"]["read_bytes"], "rchar": io["rchar"] - st["io0"]["rchar"]}

    def on_batch(_: int) -> None:
        st["count"] += 1
        if st["count"] == 1:
            st["first_batch_s"] = time.perf_counter() - st["t0"]
        if measure and st["count"] == warmup and st["epoch"] == 0:
            st.update(io0=proc_io(), t0=time.perf_counter())
        if measure and st["count"] == warmup + measure < st["n"]:
            st["partial"] = {**snapshot(), "batches": measure, "first": warmup, "of": st["n"]}
            st["train_peak_rss_bytes"] = peak_rss()
            raise _Enough
        if st["count"] == st["n"]:
            st["epochs"].append(snapshot())
            if st["epoch"] == spec["epochs"] - 1:
                st["train_peak_rss_bytes"] = peak_rss()
                if spec.get("home_procs") and run["model"] != "none":    # evaluate outside the cgroup
                    Path(spec["home_procs"]).write_text(str(os.getpid()))

    run_dir = Path(run["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    reset_peak_rss()
    common = {"model": run["model"], "hidden": spec["hidden"], "lr": spec["lr"], "seed": spec["seed"],
              "eval_every": spec["epochs"], "threads": run.get("threads", spec["threads"]), "on_batch": on_batch,
              "on_start": on_start}
    report: dict[str, Any] | None = None
    try:
        if spec["packed"] is not None:
            from ..operators.train.trainer import train_packed

            report = train_packed(spec["packed"], run_dir, cpu_memory=spec["cpu_memory"],
                                  queue_depth=spec["queue_depth"], sequential=run["sequential"],
                                  check_crc=run.get("check_crc", True), store=spec["store"], **common)
        elif spec["pipeline"] in ("inmemory", "mmap"):       # on the round's stored samples
            from ..flow.runtimes import memory as inmemory
            from ..flow.runtimes import mmap

            module = inmemory if spec["pipeline"] == "inmemory" else mmap
            report = module.run(spec["store"], run_dir, fanouts=spec["fanouts"], batch_size=spec["batch_size"],
                                epochs=spec["epochs"], samples=spec["samples"], progress=False, **common)
        else:       # an online pipeline (compare's gnndrive, lsmgnn): no preparation, batches sampled on the fly
            from ..flow.pipeline import load_pipeline

            report = load_pipeline(spec["pipeline"]).run(
                spec["store"], run_dir, fanouts=spec["fanouts"], batch_size=spec["batch_size"], epochs=spec["epochs"],
                cpu_memory=spec["cpu_memory"], progress=False, **common)
    except _Enough:
        report = None
    return {"epochs": st["epochs"], "partial": st["partial"], "train_peak_rss_bytes": st["train_peak_rss_bytes"],
            "report": report}


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
