"""`diskflow.Model`: a user's model declared once, and finding one by built-in name or ``.py`` file.

A model is a factory from ``(in_channels, out_channels)`` to a `torch.nn.Module` called as
``model(x, edge_index)``, with an optional loss, optimizer, learning-rate schedule and gradient
clipping (`operators.train.optim` builds and steps them). Pipelines decide where a batch's
features come from; the model decides what is trained on them and how, so the same declaration
runs on every path: in memory, packed, online, streamed to a GPU worker and data-parallel on N
of them.

A run names its model by a string (`TrainConfig.model`): a built-in name or the path of a
``.py`` file. That string is what travels to Dask workers (a function of a file imported
under a made-up module name cannot be pickled by reference), and the process that trains
imports the file itself, as it does a user's tier policy. The file's bytes are hashed, so a
checkpoint knows which code it was made with.

Imports no torch: configs are checked where no model runs (the CLI, a Dask client).
"""
from __future__ import annotations

import hashlib
import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, InputError

if TYPE_CHECKING:
    import torch

__all__ = ["BUILTIN_MODELS", "DATA_ONLY", "SCHEDULES", "SHAPE_OPTIONS", "USER_MODULE", "Model", "accepted",
           "check_clip_grad", "check_model_option", "file_hash", "is_model_file", "model_identity",
           "model_label"]

BUILTIN_MODELS = ("sage", "gcn", "gat", "mlp")
DATA_ONLY = "none"      # model name that runs only the data path (batches built and dropped, for timing)
USER_MODULE = "diskflow_user_model"
# Shape options a factory may take besides (in_channels, out_channels), by keyword.
SHAPE_OPTIONS = ("hidden_channels", "num_layers", "dropout", "heads", "edge_dim", "metadata")
# When a scheduler steps: after every epoch (StepLR, CosineAnnealingLR over epochs, ReduceLROnPlateau on the
# epoch's training loss) or after every optimizer step (OneCycleLR, warm-up schedules).
SCHEDULES = ("epoch", "step")


@dataclass(frozen=True)
class Model:
    """A model factory and how to train it: the one way a model is stated.

    Attributes:
        name: a short name (reports, run directories, checkpoints).
        factory: ``factory(in_channels, out_channels) -> torch.nn.Module``, called as
            ``module(x, edge_index)`` and returning one row of logits per node of `x` (or per
            seed: the first ``batch_size`` rows are the seeds'). A factory may also take any of
            ``hidden_channels``, ``num_layers``, ``dropout`` and ``heads`` by keyword: it then
            gets the run's ``--hidden``, ``--num-layers``, ``--dropout`` and ``--heads``; and
            ``edge_dim``: the width of the graph's edge features (None where it has none); and
            ``metadata``: a typed graph's ``(node_types, edge_types)``, for a factory that builds a
            heterogeneous module itself (called ``module(x_dict, edge_index_dict)``; any other factory's
            module is made heterogeneous by PyG's ``to_hetero``). A module
            whose ``forward`` takes ``edge_attr`` is given each batch's edge features, aligned with
            ``edge_index``. For a link task the module is the encoder: `out_channels` is the width of
            the node embeddings the decoder scores pairs from.
        loss: ``loss(logits, target) -> scalar tensor`` over a batch's seeds; None: cross-entropy
            (weighed by the training split's label shares for partition batches).
        trim: the module takes PyG's ``num_sampled_nodes_per_hop`` and
            ``num_sampled_edges_per_hop`` keywords (`trim_to_layer`) and gives the seeds the same
            logits with them: layer k then skips what cannot reach the seeds.
        seeds_only: the module reads a node's own row only (an MLP): it is given the seeds' rows.
        optimizer: ``optimizer(params) -> torch.optim.Optimizer`` over the module's parameters; it
            may also take ``lr`` and ``weight_decay`` by keyword, and then gets the run's ``--lr``
            and ``--weight-decay``. None: Adam with those two.
        scheduler: ``scheduler(optimizer) -> torch.optim.lr_scheduler.LRScheduler`` (or a
            ``ReduceLROnPlateau``, stepped with the epoch's mean training loss); it may take
            ``epochs`` by keyword. None: a constant learning rate.
        schedule: when the scheduler steps: ``"epoch"`` (after each epoch) or ``"step"`` (after
            each optimizer step).
        clip_grad: clip the gradients' total L2 norm to this before each optimizer step (the
            run's ``--clip-grad`` overrides it); None: no clipping.
        decoder: (link task) ``decoder(channels) -> torch.nn.Module`` called as ``module(h_src, h_dst)``
            on the embeddings of a batch's pairs' two ends ([pairs, channels] each) and returning one
            score (a logit) per pair; None: the dot product. Its loss is the model's `loss` (called with
            the scores and the pairs' 0/1 labels), else binary cross-entropy on the logits.
        source: the ``.py`` file that defines it (set by `load_model`; None for built-ins and
            models made in the caller's own process).
        code_hash: sha256 of that file's bytes ("" without a file).
    """

    name: str
    factory: Callable[..., Any]
    loss: Callable[..., Any] | None = None
    trim: bool = False
    seeds_only: bool = False
    optimizer: Callable[..., Any] | None = None
    scheduler: Callable[..., Any] | None = None
    schedule: str = "epoch"
    clip_grad: float | None = None
    decoder: Callable[..., Any] | None = None
    source: str | None = field(default=None, compare=False)
    code_hash: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "/\\ "):
            raise ConfigError("Model.name", f"expected a short name without spaces or slashes, got {self.name!r}")
        if not callable(self.factory):
            raise ConfigError("Model.factory", f"expected a callable (in_channels, out_channels) -> torch.nn.Module, "
                                               f"got {type(self.factory).__name__}")
        if self.loss is not None and not callable(self.loss):
            raise ConfigError("Model.loss", f"expected a callable (logits, target) -> loss, or None, "
                                            f"got {type(self.loss).__name__}")
        for name, shape in (("optimizer", "(params) -> torch.optim.Optimizer"),
                            ("scheduler", "(optimizer) -> torch.optim.lr_scheduler.LRScheduler"),
                            ("decoder", "(channels) -> torch.nn.Module")):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ConfigError(f"Model.{name}", f"expected a callable {shape}, or None, got {type(value).__name__}")
        if self.schedule not in SCHEDULES:
            raise ConfigError("Model.schedule", f"expected one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        check_clip_grad("Model.clip_grad", self.clip_grad)

    @property
    def where(self) -> str:
        """What an error names: the file that defines the model, or its name."""
        return self.source or f"model {self.name!r}"

    @property
    def named(self) -> str:
        """The model as a message names it: its file, then its name (``my_model.py: model 'x'``), or its name
        alone for a model made in the caller's own process."""
        return f"{self.source}: model {self.name!r}" if self.source else f"model {self.name!r}"

    def error(self, fault: str) -> InputError:
        """An `InputError` about this model, naming it once: ``my_model.py: model 'x': fault`` (the file is the
        error's path), or ``model 'x': fault`` for a model made in the caller's own process."""
        if self.source:
            return InputError(self.source, f"model {self.name!r}: {fault}")
        return InputError(f"model {self.name!r}", fault)

    def build(self, in_channels: int, out_channels: int, **shape: Any) -> torch.nn.Module:
        """The module for features of width `in_channels` and `out_channels` classes.

        `shape` holds the run's `SHAPE_OPTIONS`; the factory gets those its signature names.

        Raises:
            InputError: (`error`) the factory raised, or returned something that is not a module.
        """
        import torch

        kwargs = accepted(self.factory, {k: v for k, v in shape.items() if k in SHAPE_OPTIONS})
        return self.call("factory", self.factory, (in_channels, out_channels), kwargs, torch.nn.Module,
                         "a torch.nn.Module", f"in_channels={in_channels}, out_channels={out_channels}")

    def call(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             expected: type | tuple[type, ...], expected_name: str, called: str) -> Any:
        """``fn(*args, **kwargs)``, one of this model's factories (`what`: ``"factory"``, ``"optimizer factory"``,
        ...), held to its contract: what it raises, or a result that is not an `expected` (`expected_name`), is
        one `error` naming the model and how it was `called`.

        Raises:
            InputError: (`error`) the factory raised, or returned something else.
        """
        try:
            out = fn(*args, **kwargs)
        except ConfigError:
            raise
        except Exception as e:
            raise self.error(f"its {what} raised {type(e).__name__}: {e} (called with {called})") from e
        if not isinstance(out, expected):
            raise self.error(f"its {what} returned {type(out).__name__}, expected {expected_name}")
        return out

    def describe(self) -> dict[str, Any]:
        """The model as JSON values: name, file and code hash (reports and checkpoints)."""
        return {"name": self.name, "source": self.source, "code_hash": self.code_hash}


def check_clip_grad(option: str, value: object) -> None:
    """Raise `ConfigError` (naming `option`) unless `value` is None or a positive, finite number."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(option, f"expected a positive gradient norm (or None: no clipping), got {value!r}")


def accepted(factory: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """The `options` that `factory`'s signature takes by keyword (all of them where it takes ``**kwargs``)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return options
    return {k: v for k, v in options.items() if k in params and params[k].kind is not inspect.Parameter.POSITIONAL_ONLY}


def is_model_file(text: str) -> bool:
    """Whether a `--model` value names a file rather than a built-in model."""
    return text.endswith(".py") or os.sep in text or "/" in text


def check_model_option(model: object, option: str = "model") -> None:
    """Raise `ConfigError` (naming `option`) unless `model` is a built-in name, ``"none"``, the path of an
    existing ``.py`` file, or a `Model`. Imports nothing: the file is read where the model is built."""
    if isinstance(model, Model):
        return
    if not isinstance(model, str) or not model:
        raise ConfigError(option, f"expected a model name ({', '.join(BUILTIN_MODELS)}), the path of a .py file "
                                  f"that defines a diskflow.Model, or a diskflow.Model; got {model!r}")
    if model in BUILTIN_MODELS or model == DATA_ONLY:
        return
    if not is_model_file(model):
        raise ConfigError(option, f"unknown model {model!r}; expected one of {', '.join(BUILTIN_MODELS)}, or the path "
                                  "of a .py file that defines a diskflow.Model")
    if not Path(model).is_file():
        raise ConfigError(option, f"no such file {model!r} (a model file is a .py file that defines a diskflow.Model)")


def model_label(model: object) -> str:
    """A short name for run directories and titles: the built-in name, or the file's stem, or the Model's name."""
    if isinstance(model, Model):
        return model.name
    text = str(model)
    return Path(text).stem if is_model_file(text) else text


def file_hash(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes (a model's code)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as e:
        raise InputError(path, f"unreadable model file ({e.strerror or e})") from e


def model_identity(model: object) -> dict[str, str]:
    """What a checkpoint records of the model: its name and a hash of its code ("" for built-ins)."""
    if isinstance(model, Model):
        return {"name": model.name, "code_hash": model.code_hash}
    text = str(model)
    if is_model_file(text):
        return {"name": model_label(text), "code_hash": file_hash(text)}
    return {"name": text, "code_hash": ""}
