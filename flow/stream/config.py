"""A streamed run's configuration (`StreamConfig`) and the error that stops a run."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from ...errors import ConfigError, DiskflowError
from ...operators.formats.hashing import config_hash
from ...operators.formats.rowcodec import ENCODINGS
from ...operators.prepare.history import DEFAULT_COOLDOWN, DEFAULT_RAMP, DEFAULT_STALENESS
from ...operators.prepare.policies import policy_id
from ...operators.prepare.round import RoundOptions
from ...operators.prepare.seeds import PARTS_PER_GROUP
from ...operators.prepare.typedsample import fanouts_json

__all__ = ["CACHES", "PARTITION_FILE", "PHASES", "StreamConfig", "StreamStopped"]

PHASES = ("sample", "plan", "pack", "ship", "train")
PARTITION_FILE = "partition.npy"        # partition batches: the parts, in the run directory


class StreamStopped(DiskflowError):
    """The streamed run had to stop (a lost worker or scheduler, a superbatch that fails verification)."""


# options added after the first checkpoints were written, with the values runs before them had (left out of the
# fingerprint; history_prune: the rule every cache pruned by before the option existed)
_LATER: dict[str, Any] = {"batches": "shuffled", "partitions": None, "parts_per_group": PARTS_PER_GROUP,
                          "group_by": "label", "history_rows": 0, "history_staleness": DEFAULT_STALENESS,
                          "history_select": "accesses", "history_prune": "subtree", "gpus": 1, "cache": "per-worker",
                          "history_ramp": DEFAULT_RAMP, "history_cooldown": DEFAULT_COOLDOWN, "rows": "exact"}
CACHES = ("per-worker", "shared")    # how the CPU tiers of several GPU workers are planned


@dataclass(frozen=True)
class StreamConfig(RoundOptions):
    """A streamed run: the round, the tiers' budgets, the stream's window, and the trainer's options.

    The round's options are `RoundOptions`' (budgets in bytes: `gpu_memory` the GPU tier, `cpu_memory` what
    the tiers may take of the trainer's host memory, CPU tier + staging of `staging_batches` batches, as
    `PrepareConfig`'s; partition batches: the graph is partitioned once, on a CPU worker); `history_rows`
    and the `history_*` rule plan a historical embedding cache into the samples as `prepare` does (the one-hop
    tasks of the whole round, then the plan, run before the first sample: the plan of a batch depends on every
    batch before it).
    """

    train: Any = field(kw_only=True)    # operators.stream.train.StreamTrainConfig
    # Half prepare's 64: the first superbatch is prepared before anything trains, so a smaller one starts the
    # GPU worker sooner (`flow.runtimes.stream.run`'s superbatch_size says what larger ones amortize).
    superbatch_size: int = 32
    # 3 (prepare's count at queue depth 1, not its 4 at depth 2): `flow.runtimes.stream.run` and the benches
    # pass the count `packed_budgets` sizes, so only a config built directly (tests) takes this one; kept so
    # that what those compute stays as it is.
    staging_batches: int = 3
    device: str | None = None           # None: the GPU worker's own device (CUDA when it has it)
    tier_superbatches: int = 2
    window: int = 2
    stage: str | None = None
    checkpoint_every: int = 1
    gpu_wait_s: float = 60.0
    poll_s: float = 0.5
    history_rows: int = 0               # a historical embedding cache's embeddings (0: none), planned into the samples
    gpus: int = 1                       # GPU workers training data-parallel, each its share of every superbatch
                                        # (0: every worker with the GPU resource when the run starts)
    cache: str = "per-worker"           # their CPU tiers: each its own over its own accesses, or one shared
                                        # (one machine's GPU workers) over the merged stream
    group_timeout_s: float = 600.0      # how long a data-parallel step waits for the other GPU workers
    rows: str = "exact"                 # how feature rows are held in the tiers and bundles (`rowcodec.ENCODINGS`)

    def validate(self) -> None:
        self.check_round()
        for option, value in (("window", self.window), ("tier_superbatches", self.tier_superbatches),
                              ("checkpoint_every", self.checkpoint_every), ("staging_batches", self.staging_batches),
                              ("sampler_threads", self.sampler_threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(option, f"expected an integer >= 1, got {value!r}")
        for option, nbytes in (("gpu_memory", self.gpu_memory), ("cpu_memory", self.cpu_memory)):
            if nbytes < 0:
                raise ConfigError(option, f"must be >= 0 bytes, got {nbytes}")
        if self.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError("device", f"expected cpu or cuda[:N], got {self.device!r}")
        if isinstance(self.history_rows, bool) or not isinstance(self.history_rows, int) or self.history_rows < 0:
            raise ConfigError("history_memory", f"the cache's rows must be an integer >= 0, got {self.history_rows!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise ConfigError("gpus", f"expected an integer >= 1 (or 0: every GPU worker), got {self.gpus!r}")
        if self.gpus > self.superbatch_size:
            raise ConfigError("gpus", f"{self.gpus} GPU workers share each superbatch's batches; a superbatch of "
                                      f"{self.superbatch_size} (superbatch_size) leaves some with none")
        if self.gpus > 1 and self.history_rows:
            raise ConfigError("history_memory", "a historical embedding cache is planned for one model's order of "
                                                "batches; it trains on one GPU worker (gpus=1)")
        if self.rows not in ENCODINGS:
            raise ConfigError("rows", f"expected one of {', '.join(ENCODINGS)}, got {self.rows!r}")
        if self.cache not in CACHES:
            raise ConfigError("cache", f"expected one of {', '.join(CACHES)}, got {self.cache!r}")
        if not self.group_timeout_s > 0:
            raise ConfigError("group_timeout_s", f"must be > 0 seconds, got {self.group_timeout_s!r}")
        if self.history_rows and len(self.fanouts) < 2:
            raise ConfigError("history_memory", "a historical embedding cache needs two or more hops")
        self.check_shuffled()

    def describe(self) -> dict[str, Any]:
        """The config as JSON values, policies by `policy_id` (the GPU policy only when not the default)."""
        out = {**asdict(self), "cpu_policy": policy_id(self.cpu_policy)}
        if self.gpu_policy == "hottest":
            out.pop("gpu_policy")
        else:
            out["gpu_policy"] = policy_id(self.gpu_policy)
        return out

    def fingerprint(self, store_hash: str) -> str:
        """What a checkpoint must match to be resumed (options that change results; not the window)."""
        keep = {k: v for k, v in self.describe().items()
                if k not in ("window", "stage", "checkpoint_every", "gpu_wait_s", "poll_s", "train", "group_timeout_s")
                and not (k in _LATER and v == _LATER[k])      # checkpoints made before these existed still match
                and not (k == "history_prune" and not self.history_rows)}   # no cache: no rule
        train = {k: v for k, v in self.train.as_json().items() if k not in ("queue_depth", "check_crc", "store")
                 and not (k == "label_prior" and v is None)
                 and k not in ("shared_tier", "shared_timeout_s", "rank")
                 and not (k == "world" and v == 1)
                 and not (k == "batches_per_step" and v == 1)}
        return config_hash({"store": store_hash, **keep, "fanouts": fanouts_json(self.fanouts),
                            "train": {**train, "model": self.train.model_key(), "fanouts": train["fanouts"]}})
