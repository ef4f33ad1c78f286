"""Prepare's config: everything that shapes a packed dataset (`PrepareConfig`, checked by its `validate`),
and what a prepare reports back (`PrepareResult`). A pipeline's options become a `PrepareConfig` through
`diskflow.api.prepare_options` and `Pipeline.prepare_config`; the stages' cache keys are taken from it in
`flow.prepare.cache`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...operators.formats.rowcodec import ENCODINGS
from ...operators.formats.store import Store
from ...operators.options import DEVICE, QUEUE_DEPTH
from ...operators.prepare.history import EMBEDDING_DTYPE, history_rows
from ...operators.prepare.partition import PARTITIONERS, default_parts
from ...operators.prepare.policies import policy_id
from ...operators.prepare.round import RoundOptions
from ...operators.prepare.typedsample import fanouts_json
from ...operators.train.config import TrainConfig
from ..options import DEFAULT_SHARE

__all__ = ["PREPARE_DEFAULTS", "PrepareConfig", "PrepareResult"]

READAHEAD_GIB = 1       # GiB of features read into the page cache while sampling and planning


@dataclass(frozen=True)
class PrepareConfig(RoundOptions):
    """Everything that shapes a packed dataset (budgets in bytes): the round's options (`RoundOptions`, whose
    defaults are prepare's) and what only a prepared round has."""

    pipeline: str = "belady"
    packing: bool = True                # False: misses are read row by row from the store (Ginex)
    disk_cache: bool = True             # False: a disk budget that packing exceeds is an error, not a disk cache
    cpu_memory_default: bool = False    # cpu_memory is a default: raised to the smallest that works, not refused
    disk_budget: int | None = None      # None: no limit on packed bytes
    minhash_k: int = 2
    readahead: int = READAHEAD_GIB << 30   # bytes (a literal: no byte parser, and no Dask, imported for it)
    partitioner: str = "kaminpar"       # "kaminpar" or "metis" (operators.prepare.partition)
    partition_threads: int = 1          # the partitioner's threads (1: the same parts on every run)
    history_memory: int = 0             # bytes of a historical embedding cache planned into the samples (0: none)
    history_dim: int = TrainConfig.hidden       # its embedding width: the model's hidden channels
    history_split: bool = False         # choose history_memory out of cpu_memory (`flow.memsplit`): fewest disk bytes
    device: str = DEVICE                # RoundOptions' default, typed as prepare takes it: "cpu" or "cuda", never None
    check_crc: bool = True              # check the store's bytes against its checksums as they are read (no key)
    rows: str = "exact"                 # how feature rows are held out of the model: exact, or an encoding
                                        # (`operators.formats.rowcodec`: float16, bfloat16, int8)

    def validate(self) -> None:
        """Raise a `ConfigError` naming the first option that is out of range or does not apply."""
        self.check_round(cached=bool(self.history_memory or self.history_split))
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", f"expected cpu or cuda, got {self.device!r}")
        if self.device == "cpu" and self.gpu_memory > 0:
            raise ConfigError("gpu_memory", f"a GPU tier of {self.gpu_memory:,} bytes was asked for on a CPU-only "
                                            "run (device='cpu'); use gpu_memory=0 or train with device='cuda'")
        for option, got, least, unit in (
                ("gpu_memory", self.gpu_memory, 0, " bytes"), ("cpu_memory", self.cpu_memory, 0, " bytes"),
                ("history_memory", self.history_memory, 0, " bytes"), ("readahead", self.readahead, 0, " bytes"),
                ("staging_batches", self.staging_batches, 1, ""), ("minhash_k", self.minhash_k, 1, ""),
                ("sampler_threads", self.sampler_threads, 1, ""), ("partition_threads", self.partition_threads, 1, "")):
            if got < least:
                raise ConfigError(option, f"must be >= {least}{unit}, got {got}")
        if not self.packing and self.disk_budget is not None:
            raise ConfigError("disk_budget", f"the {self.pipeline} pipeline packs nothing, so a disk budget does not apply")
        if self.disk_budget is not None and self.disk_budget <= 0:
            raise ConfigError("disk_budget", f"must be > 0, got {self.disk_budget}")
        if self.rows not in ENCODINGS:
            raise ConfigError("rows", f"expected one of {', '.join(ENCODINGS)}, got {self.rows!r}")
        if self.rows != "exact" and not self.packing:
            raise ConfigError("rows", f"the {self.pipeline} pipeline reads its misses from the store at train time, "
                                      "where rows are exact; encoded rows need a pipeline that packs them")
        if self.rows != "exact" and self.history_split:
            raise ConfigError("rows", "the memory split (history_memory auto) weighs embeddings against exact rows; "
                                      "give history_memory a size, or keep rows exact")
        if self.partitioner not in PARTITIONERS:
            raise ConfigError("partitioner", f"expected one of {', '.join(PARTITIONERS)}, got {self.partitioner!r}")
        self.check_shuffled()
        if self.history_split:
            if self.history_memory:
                raise ConfigError("history_memory", "auto chooses the embedding cache's bytes; give auto or a size, not both")
            if self.cpu_memory <= 0:
                raise ConfigError("history_memory", "auto splits cpu_memory between the caches; give a CPU budget")
        if (self.history_memory or self.history_split) and len(self.fanouts) < 2:
            raise ConfigError("history_memory", "a historical embedding cache needs two or more hops")
        if self.history_memory and self.history_rows == 0:
            raise ConfigError("history_memory", f"{self.history_memory:,} bytes hold no embedding of "
                                                f"{self.history_dim} {EMBEDDING_DTYPE} values")

    def partition_only(self) -> tuple[tuple[str, object, object], ...]:
        return (*super().partition_only(), ("partitioner", self.partitioner, PrepareConfig.partitioner),
                ("partition_threads", self.partition_threads, PrepareConfig.partition_threads))

    @property
    def history_rows(self) -> int:
        """Embeddings the historical cache holds (0: no cache)."""
        return history_rows(self.history_memory, self.history_dim) if self.history_memory else 0

    def describe(self) -> dict[str, Any]:
        """The config as JSON values (a policy function by its `policy_id`): what a manifest records."""
        return {**asdict(self), "cpu_policy": policy_id(self.cpu_policy), "gpu_policy": policy_id(self.gpu_policy),
                "fanouts": fanouts_json(self.fanouts)}

    def num_partitions(self, store: Store) -> int:
        """The parts of the partition (`operators.prepare.partition.default_parts`)."""
        return default_parts(int(store.manifest.get("split_counts", {}).get("train", 0)), store.num_nodes,
                             self.partitions, self.batch_size)


# prepare's options (`diskflow.prepare`, `diskflow prepare`) and their defaults: PrepareConfig's fields, less those a
# pipeline fixes; budgets as text (a share of the features, or bytes); None where the pipeline's own applies
# (fanouts, batches, the history cache's), resolved in `diskflow.api.prepare_options`
PREPARE_DEFAULTS: dict[str, Any] = {
    **{k: getattr(PrepareConfig, k) for k in (
        "gpu_memory", "disk_budget", "device", "batch_size", "superbatch_size", "epochs", "seed", "partitions",
        "parts_per_group", "group_by", "partitioner", "partition_threads", "history_select", "minhash_k",
        "neg_ratio", "neg_sampling")},
    "task": None,       # None: the pipeline's (node classification unless it says link)
    "rows": None,       # None: the pipeline's (exact unless it names an encoding)
    "cpu_memory": DEFAULT_SHARE, "readahead": f"{READAHEAD_GIB}GiB", "queue_depth": QUEUE_DEPTH,
    "fanouts": None, "batches": None, "history_memory": None, "history_staleness": None, "history_prune": None,
    "history_ramp": None, "history_cooldown": None, "hidden": TrainConfig.hidden, "check_crc": True,
    "staging_piece": None,  # None: tiers.STAGING_PIECE_BYTES
}

@dataclass
class PrepareResult:
    """What `prepare` did and the headline figures of the packed dataset."""

    path: Path
    skipped: bool
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)       # wall seconds per phase
    phase_cpu: dict[str, float] = field(default_factory=dict)    # CPU seconds of this process per phase
    chain_s: float = 0.0                # the serial plan chain: the plan tasks' seconds, one after the other
