"""The training options every pipeline shares, with their defaults in one place: `TrainConfig`.

The in-memory, packed and streamed trainers all take a `TrainConfig` (the streamed one adds its
loader's options, `operators.stream.train.StreamTrainConfig`), so a default or a check changes
here once. Imports no torch: a config can be built, validated and pickled where no model runs
(the Dask client of a streamed run, the CLI).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..formats.errors import ConfigError

MODELS = ("sage", "gcn", "gat", "mlp")
DATA_ONLY = "none"      # model name that runs only the data path (batches built and dropped, for timing)


def _positive_int(option: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(option, f"expected an integer >= 1, got {value!r}")


HISTORY_MODELS = ("sage", "gat")      # models whose layers a pruned subtree leaves well defined


@dataclass(frozen=True)
class TrainConfig:
    """What to train and how; validated on construction (errors name the CLI option).

    Attributes:
        model: one of `MODELS`, or `DATA_ONLY` ("none": build every batch, train nothing).
        hidden, num_layers, dropout, heads: the model's shape; `num_layers` defaults to the
            number of hops (``len(fanouts)``).
        fanouts: `fanouts[k]` neighbours sampled at hop k (-1: all of them).
        batch_size, epochs, lr, seed: training; the same seed gives the same losses.
        eval_every: evaluate val/test every this many epochs (and after the last one).
        threads: torch's intra-op threads (None: torch's own setting). They may change the
            order of floating-point sums, but not what a checkpoint resumes.
        history_rows: rows of the model's historical embedding cache (`train.history`; 0: none).
        label_prior: the training split's share of each label, or None. Given (partition
            batches do), each batch's loss weighs its seeds so that its labels count as in the
            split (`loop.prior_weighted_loss`): a batch of a few min-cut parts holds a skewed
            mix of labels, and an unweighted loss would follow that skew from batch to batch.
        batches_per_step: consecutive batches (of a superbatch, or of an epoch) whose mean gradient
            makes one optimizer step (`steps.Accumulate`): what a data-parallel run on this many
            GPU workers computes, in one process.
    """

    model: str = "sage"
    hidden: int = 128
    num_layers: int | None = None
    fanouts: tuple[int, ...] = (10, 10, 10)
    batch_size: int = 1024
    epochs: int = 3
    lr: float = 3e-3
    dropout: float = 0.2
    heads: int = 4
    seed: int = 0
    eval_every: int = 1
    threads: int | None = None
    history_rows: int = 0
    label_prior: tuple[float, ...] | None = None
    batches_per_step: int = 1

    def __post_init__(self) -> None:
        if self.model not in MODELS and self.model != DATA_ONLY:
            raise ConfigError("--model", f"unknown model {self.model!r}; expected one of {', '.join(MODELS)}")
        fanouts = tuple(self.fanouts)
        if not fanouts or any(isinstance(f, bool) or int(f) != f or f < -1 for f in fanouts):
            raise ConfigError("--fanouts", f"expected one or more integers >= -1 (-1: all neighbours), "
                                           f"got {list(self.fanouts)}")
        object.__setattr__(self, "fanouts", tuple(int(f) for f in fanouts))
        if self.num_layers is None:
            object.__setattr__(self, "num_layers", len(fanouts))
        if self.label_prior is not None:
            prior = tuple(float(p) for p in self.label_prior)
            if not prior or any(not math.isfinite(p) or p < 0 for p in prior) or sum(prior) <= 0:
                raise ConfigError("label_prior", f"expected non-negative label shares with a positive sum, "
                                                 f"got {list(self.label_prior)[:8]}")
            object.__setattr__(self, "label_prior", prior)
        if self.history_rows < 0:
            raise ConfigError("--history-memory", f"the cache's rows must be >= 0, got {self.history_rows}")
        if self.history_rows > 0 and not self.data_only:
            if self.model not in HISTORY_MODELS:
                raise ConfigError("--model", f"a historical embedding cache works with {', '.join(HISTORY_MODELS)} "
                                             f"(GCN's normalisation reads each source's sampled degree, which pruning "
                                             f"changes), got {self.model!r}")
            if self.num_layers != len(self.fanouts):
                raise ConfigError("--num-layers", f"a historical embedding cache needs one layer per sampled hop "
                                                  f"({len(self.fanouts)}), got {self.num_layers}")
        for option, value in (("--hidden", self.hidden), ("--num-layers", self.num_layers),
                              ("--batch-size", self.batch_size), ("--epochs", self.epochs),
                              ("--eval-every", self.eval_every), ("--heads", self.heads),
                              ("--batches-per-step", self.batches_per_step)):
            _positive_int(option, value)
        if self.threads is not None:
            _positive_int("--threads", self.threads)
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                                             and self.lr > 0):
            raise ConfigError("--lr", f"expected a positive number, got {self.lr!r}")
        if isinstance(self.dropout, bool) or not (isinstance(self.dropout, (int, float))
                                                  and 0.0 <= self.dropout < 1.0):
            raise ConfigError("--dropout", f"expected a probability in [0, 1), got {self.dropout!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("--seed", f"expected an integer >= 0, got {self.seed!r}")

    @property
    def data_only(self) -> bool:
        """Whether this run builds batches only (model "none"): no model, no losses, no evaluation."""
        return self.model == DATA_ONLY

    def due(self, epoch: int) -> bool:
        """Whether val/test are evaluated after epoch `epoch` (0-based): every `eval_every`, and the last."""
        return (epoch + 1) % self.eval_every == 0 or epoch + 1 == self.epochs

    def resumable(self) -> dict[str, Any]:
        """The options a checkpoint must match to be resumed: all of them but `threads`."""
        return {k: v for k, v in asdict(self).items() if k != "threads"}
