"""The Python API: from a PyG `Data` or a raw dataset to out-of-core training, without the command line.

Each function is what the command of the same name runs, with the same checks and the same
one-line errors (`DiskflowError` and its kinds); the CLI is a thin layer that parses flags,
calls these and prints. Dask work runs on the caller's Dask client when there is one (a
``distributed.Client`` made in a notebook: its dashboard shows the task groups), else on
Dask's local threads, or on the cluster at ``scheduler=``.

    import diskflow

    diskflow.ingest(data, "store")                          # a PyG Data, or a raw directory
    diskflow.prepare("store", "packed", cpu_memory="10%")   # belady: sample, plan, pack
    report = diskflow.train("packed", model="my_model.py")  # the pipelined direct-I/O trainer

or a loop of one's own over `PackedLoader` (prepared) or `OnlineLoader` (no preparation).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, InputError
from .flow.options import byte_budget, history_options, is_default
from .flow.pipeline import Pipeline, load_pipeline
from .flow.prepare.config import PREPARE_DEFAULTS
from .operators.ingest.links import LinkConfig
from .operators.options import BATCH_SIZE, FANOUTS, INGEST_MEMORY, SEED
from .operators.prepare.typedsample import as_fanouts
from .operators.train.config import DEFAULT_EXTRACTORS
from .operators.train.modeldef import Model, check_model_option, model_label

__all__ = ["OnlineLoader", "PackedLoader", "ingest", "prepare", "prepare_options", "synth", "train"]


@contextlib.contextmanager
def _cluster(scheduler: str | None, workers: int | None, tls: dict[str, str | None]) -> Iterator[Any]:
    """The Dask client to run on: `scheduler`'s, an embedded cluster of `workers` worker processes (0: one per
    core), or, with neither, the caller's own (none: Dask's local threads)."""
    if scheduler is None and workers is None:
        yield None
        return
    from .flow.cluster import dask_client
    from .flow.roles import tls_security

    security = tls_security(tls.get("tls_ca_file"), tls.get("tls_cert"), tls.get("tls_key"), scheduler)
    with dask_client(scheduler=scheduler, n_workers=workers, security=security) as client:
        yield client


def synth(out: str | os.PathLike[str], *, nodes: int | None = None, dim: int | None = None,
          classes: int | None = None, seed: int | None = None, force: bool = False, **options: Any) -> Path:
    """A synthetic graph in the raw format at `out` (`diskflow synth`): power-law degrees, communities,
    homophilous labels; `options` are `SynthConfig`'s other fields, and every option left out (None) takes
    `SynthConfig`'s default, as the command's flags do. Returns `out`."""
    from .flow.synth import run_synth
    from .operators.ingest.synth import SynthConfig

    given: dict[str, Any] = {"num_nodes": nodes, "feature_dim": dim, "num_classes": classes, "seed": seed}
    try:
        cfg = SynthConfig(**{k: v for k, v in given.items() if v is not None}, **options)
    except TypeError as e:
        raise ConfigError("synth", f"unknown option ({e})") from None
    return run_synth(cfg, out, force=force)


def ingest(source: Any, store: str | os.PathLike[str], *, memory_budget: str | int = INGEST_MEMORY,
           shard_rows: int | None = None, to_undirected: bool = False, allow_nonfinite: bool = False,
           force: bool = False, link_split: tuple[float, float] | None = None,
           disjoint_train_ratio: float = LinkConfig.disjoint_train_ratio, link_negatives: int = LinkConfig.negatives,
           link_seed: int = LinkConfig.seed, scheduler: str | None = None, workers: int | None = None,
           storage_options: dict[str, Any] | None = None, derive: Sequence[str] = (), **tls: str | None) -> Any:
    """Validate `source` and write it as a store at `store` (`diskflow ingest`); the `IngestResult`.

    Args:
        source: a raw dataset directory (edges/, features/, nodes/), its URL (``s3://bucket/raw``, ``gs://``,
            ``hdfs://``, or any scheme fsspec resolves: the Dask workers read the shards from it), or a PyG
            ``Data`` with ``x``, ``edge_index``, ``y``, ``train_mask``/``val_mask``/``test_mask`` and
            optionally ``edge_attr`` (written to a temporary raw directory beside `store` first, then ingested),
            or a PyG ``HeteroData`` (per node type ``x``, ``y`` and the masks, each optional; per edge type
            ``edge_index``), written as a typed raw dataset and ingested into a typed store.
        store: the store directory to create; one that holds something else is refused unless `force`.
        memory_budget, shard_rows, to_undirected, allow_nonfinite: as `diskflow ingest`'s options.
        link_split, disjoint_train_ratio, link_negatives, link_seed: the link split (`LinkConfig`), as
            `diskflow ingest`'s ``--link-*`` options.
        scheduler, workers, tls: where the Dask tasks run (default: the caller's client, or local threads).
        storage_options: for a URL, how to reach it: fsspec's options, as Dask's ``read_parquet`` takes them
            (``key``, ``secret``, ``endpoint_url``, ...); credentials otherwise come from the environment and
            the usual config files.
        derive: a typed graph's derive rules, ``TYPE=mean:SRC__REL__DST`` each (``--derive``): the featureless
            node type TYPE gets the mean of its neighbours' feature rows over that edge type.
    """
    from .flow.ingest import run_ingest
    from .operators.formats.outputs import check_replaceable
    from .operators.formats.store import STORE_KIND
    from .operators.ingest.heterotypes import find_hetero_files, is_typed_raw
    from .operators.ingest.pygimport import is_hetero
    from .operators.ingest.raw import find_raw_files

    LinkConfig(None if link_split is None else tuple(link_split), disjoint_train_ratio, link_negatives,
               link_seed).check()      # bad options fail before a cluster starts
    if isinstance(source, (str, os.PathLike)):      # a missing or empty dataset fails before a cluster starts
        find_hetero_files(source) if is_typed_raw(source) else find_raw_files(source, storage_options)
    check_replaceable(store, force, STORE_KIND)     # and so does a store path that holds something else
    with _cluster(scheduler, workers, tls):
        if isinstance(source, (str, os.PathLike)):
            return run_ingest(source, store, memory_budget=memory_budget, shard_rows=shard_rows,
                              to_undirected=to_undirected, allow_nonfinite=allow_nonfinite, force=force,
                              link_split=link_split, disjoint_train_ratio=disjoint_train_ratio,
                              link_negatives=link_negatives, link_seed=link_seed, storage_options=storage_options,
                              derive=derive)
        if not hasattr(source, "edge_index") and not is_hetero(source):
            raise InputError(repr(type(source).__name__), "expected a raw dataset directory, a torch_geometric "
                                                          "Data with x, edge_index and y, or a HeteroData")
        from .operators.ingest.pygimport import from_pyg

        parent = Path(store).absolute().parent
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".diskflow-raw-", dir=parent) as tmp:
            raw = Path(tmp) / "raw"
            from_pyg(source, raw)
            return run_ingest(raw, store, memory_budget=memory_budget, shard_rows=shard_rows,
                              to_undirected=to_undirected, allow_nonfinite=allow_nonfinite, force=force,
                              link_split=link_split, disjoint_train_ratio=disjoint_train_ratio,
                              link_negatives=link_negatives, link_seed=link_seed, derive=derive)


def prepare_options(pipeline: Pipeline, store: Any, **given: Any) -> dict[str, Any]:
    """The pipeline's `PrepareConfig` options for `store` from `given` (`PREPARE_DEFAULTS` for the rest): budgets
    turned into bytes and checked against the trainer's fixed needs, the historical embedding cache's settings.
    The one place the CLI, the benches and this API turn prepare options into a config."""
    from .flow.runtimes.packed import packed_budgets
    from .operators.prepare.task import Task

    unknown = sorted(set(given) - set(PREPARE_DEFAULTS))
    if unknown:
        raise ConfigError(unknown[0], f"not an option of prepare; expected one of {', '.join(sorted(PREPARE_DEFAULTS))}")
    o = {**PREPARE_DEFAULTS, **given}
    for name in ("queue_depth", "hidden"):      # the options PrepareConfig does not hold (its own are validated)
        if isinstance(o[name], bool) or not isinstance(o[name], int) or o[name] < 1:
            raise ConfigError(name, f"must be >= 1, got {o[name]!r}")
    fanouts = as_fanouts(o["fanouts"]) if o["fanouts"] is not None else pipeline.fanouts
    disk = None if str(o["disk_budget"]).lower() in ("none", "") else o["disk_budget"]
    task = Task(o["task"] if o["task"] is not None else pipeline.task, o["neg_ratio"], o["neg_sampling"])
    budgets = packed_budgets(store, o["cpu_memory"], o["gpu_memory"], disk, fanouts, o["batch_size"],
                             o["queue_depth"], device=o["device"], task=task, staging_piece=o["staging_piece"])
    options = {
        "gpu_memory": budgets["gpu_memory"], "cpu_memory": budgets["cpu_memory"], "disk_budget": budgets["disk_budget"],
        "cpu_memory_default": is_default(o["cpu_memory"]),     # the default 10%: raised to what works, not refused
        "device": o["device"], "fanouts": fanouts, "batch_size": o["batch_size"],
        "superbatch_size": o["superbatch_size"], "epochs": o["epochs"], "seed": o["seed"],
        "staging_batches": budgets["staging_batches"], "io_reserve": budgets["io_reserve"],
        "staging_piece": budgets["staging_piece"], "minhash_k": o["minhash_k"],
        "readahead": byte_budget(o["readahead"], "readahead", store.feature_bytes) or 0,
        "parts_per_group": o["parts_per_group"], "group_by": o["group_by"], "partitioner": o["partitioner"],
        "partition_threads": o["partition_threads"], "history_select": o["history_select"],
        "neg_ratio": o["neg_ratio"], "neg_sampling": o["neg_sampling"], "check_crc": bool(o["check_crc"])}
    if o["task"] is not None:
        options["task"] = o["task"]
    if o["rows"] is not None:
        options["rows"] = o["rows"]
    if o["batches"] is not None:
        options["batches"] = "shuffled" if o["batches"] == "random" else o["batches"]
    if o["partitions"] is not None:
        options["partitions"] = o["partitions"]
    options.update(history_options(o["history_memory"], o["hidden"], store.feature_bytes, pipeline,
                                   staleness=o["history_staleness"], prune=o["history_prune"],
                                   ramp=o["history_ramp"], cooldown=o["history_cooldown"]))
    pipeline.prepare_config(**options).validate()   # bad options fail before a cluster starts
    return options


def prepare(store: str | os.PathLike[str], out: str | os.PathLike[str], pipeline: str | Pipeline = "belady", *,
            force: bool = False, quiet: bool = True, scheduler: str | None = None, workers: int | None = None,
            tls_ca_file: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
            **options: Any) -> Any:
    """Sample, plan and pack `store` into the packed dataset `out` with `pipeline` (`diskflow prepare`).

    Args:
        store: an ingested store.
        out: the packed dataset to create (its cache goes to ``out.work``).
        pipeline: a built-in name, a ``.py`` file that defines a `diskflow.Pipeline`, or one.
        force: redo even when `out` is up to date; replace `out` even when it holds something else.
        quiet: no progress bars.
        scheduler, workers, tls_*: where the Dask graph runs (default: the caller's client, or local threads).
        options: `PREPARE_DEFAULTS`'s keys: ``cpu_memory`` (bytes, ``"4GiB"`` or ``"10%"`` of the features),
            ``gpu_memory``, ``disk_budget``, ``fanouts``, ``batch_size``, ``superbatch_size``, ``epochs``,
            ``seed``, ``batches`` (``"partition"``), the history cache's, ...

    Returns:
        The `PrepareResult`: ``path``, ``skipped``, ``seconds``, ``phases`` and ``figures`` (tier sizes
        and hit counts, planned misses, bytes packed).
    """
    from .flow.prepare import check_outputs
    from .operators.formats.store import Store

    st = Store(store)                   # a bad store fails before a cluster starts
    p = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline)
    if p.loader != "packed":
        raise ConfigError("pipeline", f"the {p.name} pipeline uses the {p.loader} loader and prepares nothing; "
                                      "prepare takes pipelines with the packed loader")
    resolved = prepare_options(p, st, **options)
    check_outputs(out, force)           # and so does an out that is not ours
    from .operators.formats.storecheck import store_checks

    # the switch for the store's checksums, before an embedded cluster starts: its workers inherit it
    with store_checks(resolved["check_crc"]), \
            _cluster(scheduler, workers, {"tls_ca_file": tls_ca_file, "tls_cert": tls_cert, "tls_key": tls_key}) as client:
        if client is not None:
            from .flow.plugin import DiskflowPlugin

            # every worker's allocator reuses what it frees, as in a streamed run (`flow.allocator`)
            client.register_plugin(DiskflowPlugin())  # type: ignore[attr-defined]
        return p.prepare(st.path, out, force=force, quiet=quiet, **resolved)


def train(data: str | os.PathLike[str], model: str | os.PathLike[str] | Model = "sage", *,
          pipeline: str | Pipeline | None = None, run_dir: str | os.PathLike[str] | None = None,
          runs_dir: str | os.PathLike[str] = "runs", progress: bool = False, **options: Any) -> dict[str, Any]:
    """Train `model` and return the run's report (also written to ``RUN/report.json``).

    Args:
        data: a packed dataset (from `prepare`): the pipelined direct-I/O trainer runs on it; or
            a store: `pipeline` (default ``"inmemory"``) trains on it, preparing first where it packs.
        model: a built-in name, a ``.py`` file that defines a `diskflow.Model`, or a `Model`. A file
            is what travels to Dask workers (streamed runs); a `Model` made in this process trains here.
        pipeline: with a store: a built-in pipeline name, a ``.py`` file, or a `Pipeline`.
        run_dir: the run directory (default: a new one under `runs_dir`).
        options: the trainer's or the pipeline's options (``epochs``, ``hidden``, ``lr``, ``weight_decay``,
            ``clip_grad``, ``cpu_memory``, ``device``, ...), as the CLI's flags of the same names;
            ``check_crc=False`` (every pipeline) reads the store without checking its checksums; and
            the hooks, called in the process that trains (docs/user-guide.md, "Your optimizer and your
            hooks"):

            - ``on_epoch(record)``: after each epoch, with its record (``epoch``, ``loss``, ``losses``,
              ``train_acc``, ``val_acc``, ``test_acc``, ``lr``, ``epoch_s``, ``stage_s``); every pipeline;
            - ``on_start(epoch, batches)``: before each epoch, its index and batch count;
            - ``on_batch(n)``: after every ``n`` trained batches;
            - ``on_superbatch(result)``: a streamed run's, after each trained superbatch.

            ``on_start`` and ``on_batch`` are taken where training runs in this process (every
            pipeline but ``streaming``, and a packed dataset). A hook that raises stops the run.

    Example::

        def on_epoch(record):
            print(record["epoch"], record["loss"], record["lr"])

        report = diskflow.train("store", "my_model.py", pipeline="belady", epochs=3, on_epoch=on_epoch)
    """
    from .operators.formats.store import Store
    from .operators.formats.storecheck import store_checks

    model_arg: Any = model if isinstance(model, Model) else os.fspath(model)
    check_model_option(model_arg, "model")
    path = Path(data)
    from .operators.formats.manifest import read_manifest
    from .operators.formats.packed import PACKED_FORMAT, budget_bytes

    manifest = read_manifest(path) if path.is_dir() else None
    if manifest is not None and manifest.get("format") == PACKED_FORMAT:
        if pipeline is not None:
            raise ConfigError("pipeline", f"{path} is a packed dataset: it was prepared by the "
                                          f"{manifest.get('pipeline')} pipeline already")
        from .flow.runtimes.packed import train_and_report
        from .operators.train.trainer import train_packed

        _check_options(train_packed, options, f"training the packed dataset {path} (its round fixes the epochs, "
                                              "batches and fanouts: prepare again to change them)")
        feature_bytes = budget_bytes(manifest)
        for name in ("cpu_memory", "gpu_memory"):
            if name in options:
                options[name] = byte_budget(options[name], name, feature_bytes)
        from .runs import no_run_left

        rd, made = _run_dir(run_dir, runs_dir, f"train-{manifest.get('pipeline', 'packed')}-{model_label(model_arg)}")
        with no_run_left(rd, made, prepares=False), store_checks(bool(options.get("check_crc", True))):
            return train_and_report(path, rd, progress=progress, model=model_arg, **options)
    check_crc = bool(options.pop("check_crc", True))       # the store's checksums: every pipeline's reads
    p = pipeline if isinstance(pipeline, Pipeline) else load_pipeline(pipeline or "inmemory")
    Store(path)                 # not a store: one line naming it, before a run directory is made
    params = p.parameters()
    takes_any = any(q.kind is q.VAR_KEYWORD for q in params.values())
    unknown = [] if takes_any else sorted(set(options) - set(params))
    if unknown:
        raise ConfigError(unknown[0], _not_an_option(unknown[0], p, params, path))
    from .runs import no_run_left

    rd, made = _run_dir(run_dir, runs_dir, f"{p.name}-{model_label(model_arg)}")
    if takes_any or "progress" in params:
        options["progress"] = progress
    with no_run_left(rd, made, prepares=True), store_checks(check_crc):
        return p.run(path, rd, model=model_arg, **options)


def _run_dir(run_dir: str | os.PathLike[str] | None, runs_dir: str | os.PathLike[str], name: str) -> tuple[Path, bool]:
    """The run directory (`run_dir`, created when missing; None: a new one under `runs_dir` named after `name`)
    and whether this call made it."""
    from .flow.rundir import new_run_dir

    if run_dir is None:
        return new_run_dir(runs_dir, name), True
    rd = Path(run_dir)
    made = not rd.exists()
    rd.mkdir(parents=True, exist_ok=True)
    return rd, made


# the callbacks a pipeline's run takes besides its options (the CLI's own printing, a bench's clocks)
HOOKS = ("on_batch", "on_epoch", "on_start", "on_superbatch")


def _not_an_option(option: str, pipeline: Pipeline, params: Any, store: Path) -> str:
    """Why `option` does not train `store` with `pipeline`, and what does: the options the pipeline takes (not
    its hooks, `HOOKS`); an option of training a packed dataset says that `store` is not one and how to make one."""
    import inspect

    from .operators.train.trainer import train_packed

    if option in inspect.signature(train_packed).parameters:
        return (f"an option of training a packed dataset, and {store} is a store, not a packed dataset: prepare it "
                f"first (diskflow.prepare({str(store)!r}, PACKED), then diskflow.train(PACKED, {option}=...)), or "
                f"leave {option} out to train the store with the {pipeline.name} pipeline")
    takes = ", ".join(sorted(k for k in params if k not in ("progress", "model", *HOOKS)))
    return f"not an option of the {pipeline.name} pipeline, which takes {takes}"


def _check_options(fn: Any, options: dict[str, Any], what: str) -> None:
    """Raise `ConfigError` naming the first of `options` that `fn` does not take."""
    import inspect

    params = inspect.signature(fn).parameters
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ConfigError(unknown[0], f"not an option when {what}")


def PackedLoader(packed: str | os.PathLike[str], *, device: str = "cpu", cpu_memory: int | str | None = None,
                 gpu_memory: int | str | None = None, **options: Any) -> Any:
    """A packed dataset's round as PyG ``Data`` batches (`NeighborLoader`'s fields: ``x``, ``edge_index``, ``y``,
    ``n_id``, ``batch_size``, ``num_sampled_nodes``, ``num_sampled_edges``), read through the native direct-I/O
    loader with the load, assemble and graph stages in their own threads. A typed graph's batches are
    ``HeteroData`` with the heterogeneous ``NeighborLoader``'s fields (per node type ``x``, ``n_id``,
    ``num_sampled_nodes``, ``y`` and ``batch_size`` on the labelled type; per edge type ``edge_index``, ``e_id``,
    ``num_sampled_edges``).

    ``cpu_memory`` and ``gpu_memory`` take bytes, ``"4GiB"`` or a share of the features (``"10%"``) and are
    checked before anything is allocated. Iterating yields every batch of the round; ``loader.epochs`` lists its
    epochs and ``loader.set_epoch(e)`` selects one. ``loader.dim`` and ``loader.num_classes`` size a model;
    ``loader.stats()`` has the I/O and tier counts; ``loader.close()`` (or ``with``) frees its buffers.
    """
    from .operators.formats.manifest import read_manifest
    from .operators.formats.packed import PACKED_FORMAT, budget_bytes
    from .operators.formats.store import STORE_FORMAT
    from .operators.train.loader import PackedLoader as _Loader

    manifest = read_manifest(packed) if Path(packed).is_dir() else None
    if manifest is not None and manifest.get("format") == STORE_FORMAT:
        raise InputError(packed, f"a store, not a packed dataset: prepare it first (diskflow.prepare({str(packed)!r}, "
                                 f"PACKED), then PackedLoader(PACKED)), or draw its batches with no preparation "
                                 f"(OnlineLoader({str(packed)!r}))")
    if manifest is None or manifest.get("format") != PACKED_FORMAT:
        raise InputError(packed, "not a packed dataset (no manifest.json; run diskflow.prepare first)")
    feature_bytes = budget_bytes(manifest)
    return _Loader(packed, device=device, cpu_memory=byte_budget(cpu_memory, "cpu_memory", feature_bytes),
                   gpu_memory=byte_budget(gpu_memory, "gpu_memory", feature_bytes), typed_batches=True, **options)


def OnlineLoader(store: str | os.PathLike[str], *, batch_size: int = BATCH_SIZE, fanouts: Sequence[int] = FANOUTS,
                 cpu_memory: int | str | None = None, policy: str = "lru", extractors: int = DEFAULT_EXTRACTORS,
                 window: int | None = None, seed: int = SEED, split: str = "train", threads: int | None = None) -> Any:
    """Batches of a store's `split` with no preparation (GNNDrive): sampled as they are drawn, their rows read
    with O_DIRECT by `extractors` asynchronous readers into a fixed feature buffer of ``cpu_memory`` bytes
    (default: 10% of the features, at least one worst-case batch) that evicts by ``policy`` (``"lru"``, or
    ``"hybrid"``: LSM-GNN's lookahead of ``window`` batches, then in-degree).

    The same seed gives the same batches as the in-memory pipeline. ``loader.set_epoch(e)`` selects an epoch;
    iterating yields its batches as PyG ``Data`` (``HeteroData`` on a typed store, the fields of PyG's
    heterogeneous ``NeighborLoader``); ``loader.close()`` stops its readers.
    """
    import numpy as np
    import torch

    from .flow.runtimes.online import online_loader
    from .operators.formats.store import Store
    from .operators.prepare.sample import check_fanouts
    from .operators.prepare.samplers import store_sampler, train_target
    from .operators.train.heterobatch import TypedBatches

    st = Store(store)
    fan = check_fanouts(fanouts)
    if split not in ("train", "val", "test"):
        raise ConfigError("split", f"expected train, val or test, got {split!r}")
    labels = torch.from_numpy(np.asarray(st.labels).astype(np.int64, copy=False))
    sampler = store_sampler(st, list(fan), num_threads=threads or torch.get_num_threads())
    loader, _ = online_loader(st, labels, sampler, st.split_ids(split), batch_size=batch_size, seed=seed,
                              fanouts=fan, policy=policy, budget=cpu_memory, extractors=extractors, window=window)
    typed = train_target(st.hetero, st.path)
    return loader if typed is None else TypedBatches(loader, *typed)
