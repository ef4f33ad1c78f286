"""The training options every pipeline shares, with their defaults in one place: `TrainConfig`.

The in-memory, packed and streamed trainers all take a `TrainConfig` (the streamed one adds its
loader's options, `operators.stream.train.StreamTrainConfig`), so a default or a check changes
here once. Imports no torch: a config can be built, validated and pickled where no model runs
(the Dask client of a streamed run, the CLI).
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ...errors import ConfigError
from ..options import BATCH_SIZE, FANOUTS, SEED
from ..prepare.task import Task
from ..prepare.typedsample import EdgeFanouts, as_fanouts, fanouts_json
from .modeldef import BUILTIN_MODELS as MODELS  # (the built-in names, re-exported)
from .modeldef import DATA_ONLY, check_clip_grad, check_model_option, model_identity, model_label

__all__ = ["DATA_ONLY", "DEFAULT_EXTRACTORS", "DEFAULT_WINDOW", "HISTORY_MODELS", "MODELS", "ONLINE_TIERS",
           "TrainConfig", "check_model_identity"]


def _positive_int(option: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(option, f"expected an integer >= 1, got {value!r}")


# the online pipelines' defaults, here (torch-free) so that the command line's help reads them cheaply
DEFAULT_EXTRACTORS = 4              # GNNDrive's default: four extractors
DEFAULT_WINDOW = 8                  # lsmgnn: batches sampled ahead of the one being planned
ONLINE_TIERS = ("lru", "hybrid")    # the row cache policies (`cachepolicy.POLICIES`) the online loader takes
HISTORY_MODELS = ("sage", "gat")      # models whose layers a pruned subtree leaves well defined


@dataclass(frozen=True)
class TrainConfig:
    """What to train and how; validated on construction (errors name the field).

    Attributes:
        model: one of `MODELS`, the path of a ``.py`` file that defines a `diskflow.Model`, a
            `diskflow.Model`, or `DATA_ONLY` ("none": build every batch, train nothing).
        hidden, num_layers, dropout, heads: the model's shape; `num_layers` defaults to the
            number of hops (``len(fanouts)``).
        fanouts: `fanouts[k]` neighbours sampled at hop k (-1: all of them).
        batch_size, epochs, lr, seed: training; the same seed gives the same losses.
        weight_decay: the optimizer's weight decay (Adam's L2 penalty; a model's own optimizer
            factory gets it where it takes ``weight_decay``).
        clip_grad: clip the gradients' total L2 norm to this before each step (None: the
            model's own `Model.clip_grad`, by default no clipping).
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
        task: ``"node"`` (classify the seed nodes) or ``"link"`` (score seed edges against negative
            pairs: the model is an encoder of node embeddings and a decoder of pairs, `train.linkmodel`).
        neg_ratio, neg_sampling: a link batch's negative pairs per positive and how their ends are
            drawn (`prepare.task.Task`).
        hits_k: the K of the Hits@K a link task's evaluation reports.
    """

    model: Any = "sage"
    hidden: int = 128
    num_layers: int | None = None
    fanouts: tuple[int, ...] = FANOUTS
    batch_size: int = BATCH_SIZE
    epochs: int = 3
    lr: float = 3e-3
    weight_decay: float = 0.0
    clip_grad: float | None = None
    dropout: float = 0.2
    heads: int = 4
    seed: int = SEED
    eval_every: int = 1
    threads: int | None = None
    history_rows: int = 0
    label_prior: tuple[float, ...] | None = None
    batches_per_step: int = 1
    task: str = Task.kind
    neg_ratio: float = Task.neg_ratio
    neg_sampling: str = Task.neg_sampling
    hits_k: int = 50

    @property
    def train_task(self) -> Task:
        """The task the batches are drawn for (checked on construction)."""
        return Task(self.task, self.neg_ratio, self.neg_sampling)

    @property
    def link(self) -> bool:
        """Whether this is a link task."""
        return self.task == "link"

    def __post_init__(self) -> None:
        check_model_option(self.model, "model")
        task = self.train_task
        if task.link and self.label_prior is not None:
            raise ConfigError("batches", "a link task's batches are edges, so there is no label prior to weigh by")
        if task.link and self.history_rows > 0:
            raise ConfigError("history_memory", "a historical embedding cache serves a node task's seeds; a link "
                                                "task's are the endpoints of its pairs and negatives")
        fanouts = as_fanouts(self.fanouts) if isinstance(self.fanouts, (dict, EdgeFanouts)) else tuple(self.fanouts)
        if not fanouts or any(isinstance(f, bool) or int(f) != f or f < -1 for f in fanouts):
            raise ConfigError("fanouts", f"expected one or more integers >= -1 (-1: all neighbours), "
                                         f"got {list(self.fanouts)}")
        object.__setattr__(self, "fanouts", as_fanouts(fanouts))
        if self.num_layers is None:
            object.__setattr__(self, "num_layers", len(fanouts))
        if self.label_prior is not None:
            prior = tuple(float(p) for p in self.label_prior)
            if not prior or any(not math.isfinite(p) or p < 0 for p in prior) or sum(prior) <= 0:
                raise ConfigError("label_prior", f"expected non-negative label shares with a positive sum, "
                                                 f"got {list(self.label_prior)[:8]}")
            object.__setattr__(self, "label_prior", prior)
        if self.history_rows < 0:
            raise ConfigError("history_memory", f"the cache's rows must be >= 0, got {self.history_rows}")
        if self.history_rows > 0 and not self.data_only:
            if not isinstance(self.model, str) or self.model not in HISTORY_MODELS:
                raise ConfigError("model", f"a historical embedding cache works with {', '.join(HISTORY_MODELS)} "
                                           f"(GCN's normalisation reads each source's sampled degree, which pruning "
                                           f"changes), got {self.model!r}")
            if self.num_layers != len(self.fanouts):
                raise ConfigError("num_layers", f"a historical embedding cache needs one layer per sampled hop "
                                                f"({len(self.fanouts)}), got {self.num_layers}")
        for option, value in (("hidden", self.hidden), ("num_layers", self.num_layers),
                              ("batch_size", self.batch_size), ("epochs", self.epochs),
                              ("eval_every", self.eval_every), ("heads", self.heads),
                              ("batches_per_step", self.batches_per_step), ("hits_k", self.hits_k)):
            _positive_int(option, value)
        if self.threads is not None:
            _positive_int("threads", self.threads)
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr)
                                             and self.lr > 0):
            raise ConfigError("lr", f"expected a positive number, got {self.lr!r}")
        if isinstance(self.weight_decay, bool) or not (isinstance(self.weight_decay, (int, float))
                                                       and math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError("weight_decay", f"expected a number >= 0, got {self.weight_decay!r}")
        check_clip_grad("clip_grad", self.clip_grad)
        if isinstance(self.dropout, bool) or not (isinstance(self.dropout, (int, float))
                                                  and 0.0 <= self.dropout < 1.0):
            raise ConfigError("dropout", f"expected a probability in [0, 1), got {self.dropout!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("seed", f"expected an integer >= 0, got {self.seed!r}")

    @property
    def data_only(self) -> bool:
        """Whether this run builds batches only (model "none"): no model, no losses, no evaluation."""
        return self.model == DATA_ONLY

    def due(self, epoch: int) -> bool:
        """Whether val/test are evaluated after epoch `epoch` (0-based): every `eval_every`, and the last."""
        return (epoch + 1) % self.eval_every == 0 or epoch + 1 == self.epochs

    def resumable(self) -> dict[str, Any]:
        """The options a checkpoint must match to be resumed: all of them but `threads`, with the model
        by name and code hash (an edited model file no longer matches)."""
        options = {k: v for k, v in asdict(self).items() if k not in ("threads", "model")}
        for name, default in _LATER_FIELDS.items():   # at their defaults: the fingerprint of a run made before them
            if options[name] == default:
                del options[name]
        return {**options, "model": self.model_key()}

    def model_key(self) -> str:
        """The model as a checkpoint's fingerprint holds it: a built-in's name, a file's ``name#code hash``."""
        ident = self.model_identity()
        return f"{ident['name']}#{ident['code_hash']}" if ident["code_hash"] else ident["name"]

    def as_json(self) -> dict[str, Any]:
        """The options as JSON values (reports): a `diskflow.Model` by its name."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        if not isinstance(self.model, str):
            out["model"] = model_label(self.model)
        return {**out, "fanouts": fanouts_json(self.fanouts)}

    def model_identity(self) -> dict[str, str]:
        """The model's name and a hash of its code ("" for a built-in), as checkpoints record it."""
        return model_identity(self.model)


# fields added after checkpoints were first fingerprinted, with their defaults
_LATER_FIELDS: dict[str, Any] = {"weight_decay": 0.0, "clip_grad": None, "task": Task.kind,
                                 "neg_ratio": Task.neg_ratio, "neg_sampling": Task.neg_sampling, "hits_k": 50}


def check_model_identity(state: Mapping[str, Any], cfg: TrainConfig, source: str | os.PathLike[str]) -> None:
    """Refuse to resume a checkpoint made with another model, or with the same file's other code.

    Raises:
        ConfigError: (``resume``) naming the checkpoint, the model it was made with and what changed.
    """
    saved = state.get("model_identity")
    if not saved or cfg.data_only:
        return
    now = cfg.model_identity()
    if saved.get("code_hash") == now["code_hash"] and (now["code_hash"] or saved.get("name") == now["name"]):
        return
    if saved.get("code_hash") and now["code_hash"]:
        raise ConfigError("resume", f"the checkpoint {source} was made with model {saved.get('name')!r} whose code "
                                    f"has changed since ({cfg.model}: sha256 {str(saved['code_hash'])[:12]} then, "
                                    f"{now['code_hash'][:12]} now); restore the file, or start a new run")
    raise ConfigError("resume", f"the checkpoint {source} was made with model {saved.get('name')!r}, not "
                                f"{now['name']!r}; resume with the same model, or start a new run")
