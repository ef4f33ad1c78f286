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
from ...operators.formats.store import Store
from ...operators.prepare.history import (
    DEFAULT_COOLDOWN,
    DEFAULT_PRUNE,
    DEFAULT_RAMP,
    DEFAULT_STALENESS,
    EMBEDDING_DTYPE,
    HISTORY_SELECTS,
    check_prune,
    check_rule,
    history_rows,
    refuse_without_cache,
)
from ...operators.prepare.partition import PARTITIONERS, default_parts
from ...operators.prepare.policies import Policy, check_policy, policy_id
from ...operators.prepare.seeds import BATCH_ORDERS, GROUPINGS, PARTS_PER_GROUP
from ...operators.prepare.superbatch import check_round_config
from ...operators.prepare.tiers import staging_buffers


@dataclass(frozen=True)
class PrepareConfig:
    """Everything that shapes a packed dataset (budgets in bytes)."""

    pipeline: str = "belady"
    cpu_policy: Policy = "belady"       # "belady" (planned), "static" (most frequent rows) or a function
    gpu_policy: Policy = "hottest"      # "hottest" or a function (operators.prepare.policies)
    packing: bool = True                # False: misses are read row by row from the store (Ginex)
    disk_cache: bool = True             # False: a disk budget that packing exceeds is an error, not a disk cache
    fanouts: tuple[int, ...] = (10, 10, 10)
    batch_size: int = 1024
    superbatch_size: int = 64
    epochs: int = 1
    seed: int = 0
    gpu_memory: int = 0
    cpu_memory: int = 0
    cpu_memory_default: bool = False    # cpu_memory is a default: raised to the smallest that works, not refused
    disk_budget: int | None = None      # None: no limit on packed bytes
    device: str = "cpu"
    staging_batches: int = staging_buffers(2)    # staging buffers the pipelined trainer cycles at queue depth 2
    io_reserve: int = 0                 # the trainer's other I/O buffers, reserved out of cpu_memory too
    minhash_k: int = 2
    sampler_threads: int = 1
    readahead: int = 1 << 30            # feature bytes read into the page cache while sampling/planning
    batches: str = "shuffled"           # "shuffled" or "partition" (OUTRE: batches from groups of min-cut parts)
    partitions: int | None = None       # parts of the partition; None: eight per batch (default_parts)
    parts_per_group: int = PARTS_PER_GROUP     # parts whose training nodes are shuffled together
    group_by: str = "label"             # how parts meet in a group: "label" (mixed labels) or "random" (OUTRE's)
    partitioner: str = "kaminpar"       # "kaminpar" or "metis" (operators.prepare.partition)
    partition_threads: int = 1          # the partitioner's threads (1: the same parts on every run)
    history_memory: int = 0             # bytes of a historical embedding cache planned into the samples (0: none)
    history_dim: int = 128              # its embedding width: the model's hidden channels
    history_staleness: int = DEFAULT_STALENESS      # batches a cached embedding stays usable
    history_select: str = "accesses"    # its nodes: the round's most frequent one-hop nodes, or "degree"
    history_prune: str = DEFAULT_PRUNE  # what a fresh embedding prunes below its node: HISTORY_PRUNES
    history_ramp: float = DEFAULT_RAMP  # the adaptive staleness bound's slope (0: the fixed bound)
    history_cooldown: float = DEFAULT_COOLDOWN  # the share of the round's last batches that prune nothing
    history_split: bool = False         # choose history_memory out of cpu_memory (`flow.memsplit`): fewest disk bytes

    def validate(self) -> None:
        """Raise a `ConfigError` naming the first option that is out of range or does not apply."""
        check_round_config(self.batch_size, self.superbatch_size, self.epochs, self.fanouts)
        check_policy(self.cpu_policy, "cpu", "cpu_policy")
        check_policy(self.gpu_policy, "gpu", "gpu_policy")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("device", f"expected cpu or cuda, got {self.device!r}")
        if self.device == "cpu" and self.gpu_memory > 0:
            raise ConfigError("gpu_memory", f"a GPU tier of {self.gpu_memory:,} bytes was asked for on a CPU-only "
                                            "run (device='cpu'); use gpu_memory=0 or train with device='cuda'")
        for option, got, least, unit in (
                ("gpu_memory", self.gpu_memory, 0, " bytes"), ("cpu_memory", self.cpu_memory, 0, " bytes"),
                ("history_memory", self.history_memory, 0, " bytes"), ("readahead", self.readahead, 0, " bytes"),
                ("staging_batches", self.staging_batches, 1, ""), ("minhash_k", self.minhash_k, 1, ""),
                ("sampler_threads", self.sampler_threads, 1, ""), ("parts_per_group", self.parts_per_group, 1, ""),
                ("partition_threads", self.partition_threads, 1, "")):
            if got < least:
                raise ConfigError(option, f"must be >= {least}{unit}, got {got}")
        if not self.packing and self.disk_budget is not None:
            raise ConfigError("disk_budget", f"the {self.pipeline} pipeline packs nothing, so a disk budget does not apply")
        if self.disk_budget is not None and self.disk_budget <= 0:
            raise ConfigError("disk_budget", f"must be > 0, got {self.disk_budget}")
        if self.batches not in BATCH_ORDERS:
            raise ConfigError("batches", f"expected one of {', '.join(BATCH_ORDERS)}, got {self.batches!r}")
        if self.partitioner not in PARTITIONERS:
            raise ConfigError("partitioner", f"expected one of {', '.join(PARTITIONERS)}, got {self.partitioner!r}")
        if self.partitions is not None and self.partitions < 2:
            raise ConfigError("partitions", f"must be >= 2, got {self.partitions}")
        if self.group_by not in GROUPINGS:
            raise ConfigError("group_by", f"expected one of {', '.join(GROUPINGS)}, got {self.group_by!r}")
        if self.batches == "shuffled":
            for option, value, default in (("partitions", self.partitions, None),
                                           ("parts_per_group", self.parts_per_group, PARTS_PER_GROUP),
                                           ("group_by", self.group_by, "label"),
                                           ("partitioner", self.partitioner, "kaminpar"),
                                           ("partition_threads", self.partition_threads, 1)):
                if value != default:
                    raise ConfigError(option, "applies to partition batches only (batches='partition')")
        if self.history_split:
            if self.history_memory:
                raise ConfigError("history_memory", "auto chooses the embedding cache's bytes; give auto or a size, not both")
            if self.cpu_memory <= 0:
                raise ConfigError("history_memory", "auto splits cpu_memory between the caches; give a CPU budget")
        if self.history_select not in HISTORY_SELECTS:
            raise ConfigError("history_select", f"expected one of {', '.join(HISTORY_SELECTS)}, "
                                                f"got {self.history_select!r}")
        check_prune(self.history_prune)
        check_rule(self.history_ramp, self.history_cooldown)
        if not (self.history_memory or self.history_split):
            refuse_without_cache(self.history_staleness, self.history_prune, self.history_select,
                                 ramp=self.history_ramp, cooldown=self.history_cooldown)
        if self.history_staleness < 1:
            raise ConfigError("history_staleness", f"must be >= 1 (1: never reused), got {self.history_staleness}")
        if (self.history_memory or self.history_split) and len(self.fanouts) < 2:
            raise ConfigError("history_memory", "a historical embedding cache needs two or more hops")
        if self.history_memory and self.history_rows == 0:
            raise ConfigError("history_memory", f"{self.history_memory:,} bytes hold no embedding of "
                                                f"{self.history_dim} {EMBEDDING_DTYPE} values")

    @property
    def history_rows(self) -> int:
        """Embeddings the historical cache holds (0: no cache)."""
        return history_rows(self.history_memory, self.history_dim) if self.history_memory else 0

    def describe(self) -> dict[str, Any]:
        """The config as JSON values (a policy function by its `policy_id`): what a manifest records."""
        return {**asdict(self), "cpu_policy": policy_id(self.cpu_policy), "gpu_policy": policy_id(self.gpu_policy),
                "fanouts": list(self.fanouts)}

    def num_partitions(self, store: Store) -> int:
        """The parts of the partition (`operators.prepare.partition.default_parts`)."""
        return default_parts(int(store.manifest.get("split_counts", {}).get("train", 0)), store.num_nodes,
                             self.partitions, self.batch_size)


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
