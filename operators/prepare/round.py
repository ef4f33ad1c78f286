"""The options every planned round shares, wherever it is prepared: `RoundOptions`.

A packed dataset's round (`flow.prepare.PrepareConfig`) and a streamed run's (`flow.stream.StreamConfig`)
are cut, sampled, tiered and history-planned the same way; their common fields and the checks of those
fields are stated here once. A subclass restates a field only to give it another default, saying why.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError
from ..options import BATCH_SIZE, DEVICE, FANOUTS, QUEUE_DEPTH, SEED
from ..trainbuffers import staging_buffers
from .history import (
    DEFAULT_COOLDOWN,
    DEFAULT_PRUNE,
    DEFAULT_RAMP,
    DEFAULT_STALENESS,
    HISTORY_SELECTS,
    check_prune,
    check_rule,
    refuse_without_cache,
)
from .policies import Policy, check_policy
from .seeds import BATCH_ORDERS, GROUPINGS, PARTS_PER_GROUP
from .superbatch import check_round_config
from .task import Task
from .tiers import STAGING_PIECE_BYTES, check_staging_piece

__all__ = ["RoundOptions"]


@dataclass(frozen=True)
class RoundOptions:
    """The round (batches, superbatches, epochs, sampling), its tiers' budgets in bytes and policies, how seeds
    become batches, and the rule of a historical embedding cache planned into the samples."""

    fanouts: tuple[int, ...] = FANOUTS
    batch_size: int = BATCH_SIZE
    superbatch_size: int = 64           # minibatches per superbatch: the unit of sampling tasks and Belady planning
    epochs: int = 1
    seed: int = SEED
    sampler_threads: int = 1
    cpu_policy: Policy = "belady"       # "belady" (planned), "static" (most frequent rows) or a function
    gpu_policy: Policy = "hottest"      # "hottest" or a function (operators.prepare.policies)
    gpu_memory: int = 0
    cpu_memory: int = 0
    staging_batches: int = staging_buffers(QUEUE_DEPTH)   # staging buffers the pipelined trainer cycles
    io_reserve: int = 0                 # the trainer's other I/O buffers, reserved out of cpu_memory too
    staging_piece: int = STAGING_PIECE_BYTES    # the most row bytes one staging buffer carries (tiers.staging_piece_bytes)
    device: str | None = DEVICE
    batches: str = "shuffled"           # "shuffled" or "partition" (OUTRE: batches from groups of min-cut parts)
    partitions: int | None = None       # parts of the partition; None: eight per batch (default_parts)
    parts_per_group: int = PARTS_PER_GROUP     # parts whose training nodes are shuffled together
    group_by: str = "label"             # how parts meet in a group: "label" (mixed labels) or "random" (OUTRE's)
    history_staleness: int = DEFAULT_STALENESS      # batches a cached embedding stays usable
    history_select: str = "accesses"    # its nodes: the round's most frequent one-hop nodes, or "degree"
    history_prune: str = DEFAULT_PRUNE  # what a fresh embedding prunes below its node: HISTORY_PRUNES
    history_ramp: float = DEFAULT_RAMP  # the adaptive staleness bound's slope (0: the fixed bound)
    history_cooldown: float = DEFAULT_COOLDOWN  # the share of the round's last batches that prune nothing
    task: str = "node"                  # "node" (seed nodes' labels) or "link" (seed edges and their negatives)
    neg_ratio: float = Task.neg_ratio   # a link batch's negative pairs per positive edge
    neg_sampling: str = Task.neg_sampling   # how a negative pair's ends are drawn: "uniform" or "degree"

    @property
    def round_task(self) -> Task:
        """The task the round's batches are drawn for (checked)."""
        return Task(self.task, self.neg_ratio, self.neg_sampling)

    def check_round(self, cached: bool | None = None) -> None:
        """Raise a `ConfigError` naming the first shared option that is out of range; `cached` False: also any
        history option set away from its default, where no historical embedding cache is."""
        check_round_config(self.batch_size, self.superbatch_size, self.epochs, self.fanouts)
        check_staging_piece(self.staging_piece)
        task = self.round_task
        task.check_batches(self.batches)
        if not task.link:
            for option, given, default in (("neg_ratio", self.neg_ratio, Task.neg_ratio),
                                           ("neg_sampling", self.neg_sampling, Task.neg_sampling)):
                if given != default:
                    raise ConfigError(option, "applies to a link task only (task='link')")
        check_policy(self.cpu_policy, "cpu", "cpu_policy")
        check_policy(self.gpu_policy, "gpu", "gpu_policy")
        if self.batches not in BATCH_ORDERS:
            raise ConfigError("batches", f"expected one of {', '.join(BATCH_ORDERS)}, got {self.batches!r}")
        if self.group_by not in GROUPINGS:
            raise ConfigError("group_by", f"expected one of {', '.join(GROUPINGS)}, got {self.group_by!r}")
        if self.partitions is not None and (isinstance(self.partitions, bool) or self.partitions < 2):
            raise ConfigError("partitions", f"must be >= 2, got {self.partitions}")
        if isinstance(self.parts_per_group, bool) or self.parts_per_group < 1:
            raise ConfigError("parts_per_group", f"must be >= 1, got {self.parts_per_group}")
        if self.history_select not in HISTORY_SELECTS:
            raise ConfigError("history_select", f"expected one of {', '.join(HISTORY_SELECTS)}, "
                                                f"got {self.history_select!r}")
        check_prune(self.history_prune)
        check_rule(self.history_ramp, self.history_cooldown)
        if cached is False:
            refuse_without_cache(self.history_staleness, self.history_prune, self.history_select,
                                 ramp=self.history_ramp, cooldown=self.history_cooldown)
        if self.history_staleness < 1:
            raise ConfigError("history_staleness", f"must be >= 1 (1: never reused), got {self.history_staleness}")

    def partition_only(self) -> tuple[tuple[str, object, object], ...]:
        """(option, value, default) of the options that apply to partition batches only."""
        return (("partitions", self.partitions, None), ("parts_per_group", self.parts_per_group, PARTS_PER_GROUP),
                ("group_by", self.group_by, "label"))

    def check_shuffled(self) -> None:
        """Refuse a partition-only option (`partition_only`) set away from its default with shuffled batches."""
        if self.batches == "shuffled":
            for option, given, default in self.partition_only():
                if given != default:
                    raise ConfigError(option, "applies to partition batches only (batches='partition')")
