"""How a session's parameters are stepped: the model's optimizer, its learning-rate schedule, gradient clipping.

A `diskflow.Model` may bring its own optimizer factory, scheduler factory and clipping norm; the
built-ins train with Adam at the run's ``lr`` and ``weight_decay``. `Stepper` builds them once per
session (after the model, so the same seed gives the same weights whatever the optimizer) and is
what the training loop calls around each optimizer step. Every pipeline trains through
`session.TrainSession`, so every path (in memory, packed, online, streamed, data-parallel) steps
the same way, and a checkpoint saves the optimizer's and the scheduler's state together.

Clipping runs after the gradients of a step are complete: after the mean over a step's batches
and, data-parallel, after the ``all_reduce``, so every rank clips the same gradient.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ...errors import ConfigError
from .config import TrainConfig
from .modeldef import Model, accepted

__all__ = ["Stepper"]

_Plateau = torch.optim.lr_scheduler.ReduceLROnPlateau


def _optimizer(spec: Model | None, params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """The model's optimizer over `params` (Adam at the run's lr and weight decay without a factory)."""
    if spec is None or spec.optimizer is None:
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    options = accepted(spec.optimizer, {"lr": cfg.lr, "weight_decay": cfg.weight_decay})
    if cfg.weight_decay and "weight_decay" not in options:
        raise ConfigError("weight_decay", f"{spec.named}: its optimizer factory takes no "
                                          f"weight_decay keyword; set the decay inside the factory, or let it take "
                                          f"weight_decay (it then gets the run's)")
    optimizer: torch.optim.Optimizer = spec.call(
        "optimizer factory", spec.optimizer, (params,), options, torch.optim.Optimizer, "a torch.optim.Optimizer",
        f"the model's parameters and {_keywords(options)}")
    return optimizer


def _scheduler(spec: Model | None, optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> Any:
    """The model's learning-rate scheduler over `optimizer`, or None."""
    if spec is None or spec.scheduler is None:
        return None
    options = accepted(spec.scheduler, {"epochs": cfg.epochs})
    scheduler = spec.call("scheduler factory", spec.scheduler, (optimizer,), options,
                          (torch.optim.lr_scheduler.LRScheduler, _Plateau), "a torch.optim.lr_scheduler.LRScheduler",
                          f"its optimizer and {_keywords(options)}")
    if isinstance(scheduler, _Plateau) and spec.schedule == "step":
        raise ConfigError("Model.schedule", f"{spec.named}: ReduceLROnPlateau steps once per epoch, on the epoch's "
                                            "training loss; use schedule='epoch'")
    return scheduler


def _keywords(options: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in options.items()) or "no keywords"


class Stepper:
    """A session's optimizer step: zero the gradients, clip them, step the optimizer and the scheduler.

    Args:
        model: the module being trained (its `Model`, where it has one, is `spec`).
        spec: the `Model` that built it (None: a plain module, Adam).
        cfg: the run's options: ``lr``, ``weight_decay``, ``clip_grad`` (over the model's own
            `Model.clip_grad`) and ``epochs`` (for a scheduler factory that takes it).
    """

    def __init__(self, model: torch.nn.Module, spec: Model | None, cfg: TrainConfig) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = _optimizer(spec, list(model.parameters()), cfg)
        self.scheduler = _scheduler(spec, self.optimizer, cfg)
        self.per_step = spec is not None and spec.schedule == "step"
        self.clip = cfg.clip_grad if cfg.clip_grad is not None else (spec.clip_grad if spec is not None else None)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        """One optimizer step over the gradients now held (clipped first), then a per-step schedule's."""
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, float(self.clip))
        self.optimizer.step()
        if self.scheduler is not None and self.per_step:
            self.scheduler.step()

    def end_epoch(self, loss: float | None) -> None:
        """An epoch closed with mean training loss `loss`: a per-epoch schedule steps (a plateau on `loss`)."""
        if self.scheduler is None or self.per_step:
            return
        if isinstance(self.scheduler, _Plateau):
            if loss is not None and math.isfinite(loss):
                self.scheduler.step(loss)
        else:
            self.scheduler.step()

    @property
    def lr(self) -> float:
        """The learning rate of the optimizer's first parameter group, as it is now."""
        return float(self.optimizer.param_groups[0]["lr"])

    def describe(self) -> dict[str, Any]:
        """The optimizer as a report shows it: its class, the scheduler's and when it steps, the clipping norm."""
        sched = self.scheduler
        return {"optimizer": type(self.optimizer).__name__,
                "scheduler": type(sched).__name__ if sched is not None else None,
                "schedule": ("step" if self.per_step else "epoch") if sched is not None else None,
                "clip_grad": self.clip}

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state and the scheduler's ({} without one), as live tensors."""
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else {}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict`'s; a checkpoint without a scheduler's state for a run that has one is refused
        (KeyError, which the session reports as a corrupt or mismatched checkpoint)."""
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            saved = state.get("scheduler")
            if not saved:
                raise KeyError("scheduler (the checkpoint was made without a learning-rate scheduler)")
            self.scheduler.load_state_dict(saved)
