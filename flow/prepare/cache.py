"""Prepare's cache, ``OUT.work/`` next to the packed dataset ``OUT`` (docs/design.md, "The preparation graph"):
every stage's result (partition, samples, plans) in a directory of its own named by the hash of the config
subset it depends on (the keys below), finished by a manifest holding that key. A re-run with the same
inputs reuses every finished stage; a changed budget redoes only the stages whose key it changes. Also
what a failed run leaves to clean up, and the partition stage's hand-over to another pipeline's cache.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InputError
from ...operators.formats.atomic import atomic_path, write_json
from ...operators.formats.hashing import config_hash
from ...operators.formats.manifest import MANIFEST, read_manifest, write_manifest
from ...operators.formats.outputs import OutputKind, check_replaceable
from ...operators.formats.packed import PACKED_KIND, PACKED_VERSION
from ...operators.prepare.history import staleness_rule
from ...operators.prepare.pack import release_early_maps
from ...operators.prepare.policies import policy_id
from ...operators.prepare.tiers import STAGING_PIECE_BYTES
from ...operators.prepare.typedsample import fanouts_json
from ..memsplit import SPLIT_SHARES

# what an encoding's rows cost, for the plan stage's key: encodings of one row size share their plans, and a new
# encoding of the same size re-packs without re-planning
ROW_SIZE = {"float16": "2-byte", "bfloat16": "2-byte", "int8": "int8-row"}

if TYPE_CHECKING:
    from .config import PrepareConfig

__all__ = ["COUNTS", "EARLY", "PARTS", "ROW_SIZE", "WORK_FORMAT", "WORK_KIND", "WORK_MARKER", "CachedStage",
           "check_outputs", "clean_work", "drop_stale_stages", "link_partitions", "mark_work", "pack_key",
           "partition_key", "plan_key", "remove_orphans", "sample_key", "stage_dir"]

WORK_FORMAT = "diskflow-prepare-cache"
COUNTS = "counts.npz"                   # the sample stage's access counts over the round (sparse: ids, counts)
PARTS = "parts.npy"                     # the partition stage's file: every node's part, int32
EARLY = "early"                         # in ``OUT.work``: part files begun while planning (`pack_early`)
WORK_MARKER = ".diskflow-work.json"     # marks ``OUT.work`` as prepare's cache (see `WORK_KIND`)
# ``OUT.work``: prepare's cache; older ones (no marker) are recognised by their entries alone
WORK_KIND = OutputKind("a diskflow prepare cache", markers=(WORK_MARKER,),
                       patterns=("samples-*", "plans-*", "route", EARLY, "layout.pkl", "layout.pkl.tmp", ".*.tmp-*"))



# ---------------------------------------------------------------------------- the keys: the config subsets each stage depends on

def partition_key(cfg: PrepareConfig, store_hash: str, parts: int) -> str:
    """The partition stage's key: the store, the number of parts and the partitioner's options."""
    return config_hash({"store": store_hash, "parts": parts, "partitioner": cfg.partitioner, "seed": cfg.seed,
                        "threads": cfg.partition_threads})


def sample_key(cfg: PrepareConfig, store_hash: str, partition_key: str | None = None) -> str:
    """The sample stage's key: the store, the round's shape and seed, the batch order (`partition_key`: the
    partition's, for partition batches) and the embedding cache the samples are planned for."""
    order: dict[str, Any] = {} if cfg.batches == "shuffled" else \
        {"batches": cfg.batches, "partition": partition_key, "group": cfg.parts_per_group,
         **({"grouping": cfg.group_by} if cfg.group_by != "random" else {})}
    if cfg.history_rows:
        order["history"] = {"rows": cfg.history_rows, "dim": cfg.history_dim,
                            "staleness": cfg.history_staleness,
                            **({"select": cfg.history_select} if cfg.history_select != "degree" else {}),
                            **({"prune": cfg.history_prune} if cfg.history_prune != "subtree" else {}),
                            **staleness_rule(cfg.history_ramp, cfg.history_cooldown)}
    return config_hash({"store": store_hash, "fanouts": fanouts_json(cfg.fanouts), "batch_size": cfg.batch_size,
                        "superbatch_size": cfg.superbatch_size, "epochs": cfg.epochs, "seed": cfg.seed,
                        "counts": COUNTS, **order, **_task(cfg)})


def _task(cfg: PrepareConfig) -> dict[str, Any]:
    """A link task's part of the sample key (a node task adds nothing: older keys stay valid)."""
    return {"task": cfg.round_task.describe()} if cfg.round_task.link else {}


def plan_key(cfg: PrepareConfig, sample_key: str) -> str:
    """The plan stage's key: the samples', the policies and the memory budgets."""
    policies = {"cpu_policy": policy_id(cfg.cpu_policy)} if cfg.gpu_policy == "hottest" else \
        {"cpu_policy": policy_id(cfg.cpu_policy), "gpu_policy": policy_id(cfg.gpu_policy)}
    return config_hash({"samples": sample_key, **policies, "gpu": cfg.gpu_memory,
                        "cpu": cfg.cpu_memory, "device": cfg.device, "staging": cfg.staging_batches,
                        "io": cfg.io_reserve,
                        # a cap on the staging pieces other than the default (older keys stay valid)
                        **({"piece": cfg.staging_piece} if cfg.staging_piece != STAGING_PIECE_BYTES else {}),
                        # encoded rows: the tiers hold rows of their size (float16 and bfloat16 plan alike)
                        **({"row_size": ROW_SIZE[cfg.rows]} if cfg.rows != "exact" else {}),
                        # a default budget's plans may be a raised one's: never a user's budget's too
                        **({"cpu_default": True} if cfg.cpu_memory_default else {})})


def pack_key(cfg: PrepareConfig, plan_key: str) -> str:
    """The packed dataset's key (its manifest's ``config_hash``): the plans', the packing and disk options, the
    memory split's search and the packed format's version."""
    return config_hash({"plans": plan_key, "packing": cfg.packing, "disk": cfg.disk_budget,
                        **({} if cfg.disk_cache else {"disk_cache": False}),
                        **({"split": [*SPLIT_SHARES, "refined"], "dim": cfg.history_dim, "staleness": cfg.history_staleness,
                            "select": cfg.history_select,
                            **({"prune": cfg.history_prune} if cfg.history_prune != "subtree" else {}),
                            **staleness_rule(cfg.history_ramp, cfg.history_cooldown)}
                           if cfg.history_split else {}),
                        "k": cfg.minhash_k, "version": PACKED_VERSION, "layout": 2,
                        **({"rows": cfg.rows} if cfg.rows != "exact" else {})})


# ---------------------------------------------------------------------------- the stages

def stage_dir(work: Path, name: str, key: str) -> Path:
    """Where the stage `name` computed for `key` lives in the cache `work`."""
    return work / f"{name}-{key[:16]}"


def drop_stale_stages(work: Path, name: str, keep: Path) -> None:
    """Remove cached results of a stage computed for another config."""
    for d in work.glob(f"{name}-*"):
        if d != keep and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def _written_manifest(stage: Path) -> dict[str, Any]:
    """A cache stage's manifest just written, read back (as a later run reads it: JSON values only)."""
    manifest = read_manifest(stage)
    if manifest is None:
        raise InputError(stage / MANIFEST, "missing right after it was written (removed by another process?)")
    return manifest


def remove_orphans(root: Path) -> None:
    """Delete temp files of tasks killed mid-write (their retries wrote the real files under other names)."""
    for p in list(root.rglob(".*.tmp-*")):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


class CachedStage:
    """One cached stage of prepare's work directory, ``WORK/{name}-{key[:16]}``, finished by a manifest
    holding its key: a finished stage with the same key is reused; anything else there is redone."""

    def __init__(self, work: Path, name: str, key: str) -> None:
        self.work, self.name, self.key = work, name, key
        self.path = stage_dir(work, name, key)

    def cached(self) -> dict[str, Any] | None:
        """The manifest of this stage if it finished for this key, else None."""
        manifest = read_manifest(self.path)
        return manifest if manifest is not None and manifest.get("key") == self.key else None

    def start(self) -> Path:
        """An empty directory for the stage (whatever an earlier, unfinished run left there removed)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True)
        return self.path

    def finish(self, content: dict[str, Any], drop_stale: bool = True) -> dict[str, Any]:
        """Write the manifest (the stage is done), drop this stage's results for other keys (unless told
        not to); the manifest."""
        write_manifest(self.path, {"key": self.key, **content})
        manifest = _written_manifest(self.path)
        if drop_stale:
            drop_stale_stages(self.work, self.name, self.path)
        return manifest


def mark_work(work: Path, packed_name: str) -> None:
    """Mark `work` as a prepare cache (`WORK_MARKER`), once."""
    if not (work / WORK_MARKER).exists():
        write_json(work / WORK_MARKER, {"format": WORK_FORMAT, "packed": packed_name}, durable=False)


def link_partitions(src_work: str | os.PathLike[str], dst_work: str | os.PathLike[str]) -> list[str]:
    """Hard-link the finished partition stages of the prepare cache `src_work` into `dst_work` (a prepare
    cache, made with its marker when missing), so that a prepare of another pipeline over the same store
    with the same partition options finds its partition done (the stage key says which); the stage names
    linked. Partitioning is the slowest step of an OUTRE round (minutes on the benchmarks' graph), and its
    result depends on the store and those options alone. Copies where the two are on different filesystems."""
    src, dst = Path(src_work), Path(dst_work)
    linked: list[str] = []
    for stage in sorted(src.glob("partition-*")):
        if not (stage / MANIFEST).is_file() or (dst / stage.name).exists():
            continue
        dst.mkdir(parents=True, exist_ok=True)
        mark_work(dst, dst.name.removesuffix(".work"))
        with atomic_path(dst / stage.name, durable=False) as tmp:
            shutil.copytree(stage, tmp, copy_function=_link_or_copy)
        linked.append(stage.name)
    return linked


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def check_outputs(out: str | os.PathLike[str], force: bool) -> None:
    """Refuse (before any work, e.g. before a cluster starts) an `out` or ``out.work`` that holds
    something other than a packed dataset / prepare cache, unless `force`."""
    check_replaceable(out, force, PACKED_KIND)
    check_replaceable(str(out) + ".work", force, WORK_KIND)


def clean_work(work: Path, created: bool) -> None:
    """After a failed run: remove the cache stages it left unfinished (no manifest), and the
    whole cache directory when this run created it and nothing finished is left in it."""
    for d in [*work.glob("samples-*"), *work.glob("plans-*"), *work.glob("partition-*")]:
        if d.is_dir() and not (d / MANIFEST).exists():
            shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(work / "route", ignore_errors=True)
    shutil.rmtree(work / EARLY, ignore_errors=True)        # part files begun while planning: gigabytes, never reused
    release_early_maps(work / EARLY)                        # and the shards' maps they kept in this process
    (work / "layout.pkl").unlink(missing_ok=True)
    if work.is_dir():
        remove_orphans(work)
    if created and work.is_dir() and all(e.name == WORK_MARKER or e.name.startswith(".") for e in work.iterdir()):
        shutil.rmtree(work, ignore_errors=True)
