"""The training loop every pipeline shares: one epoch over `Data` batches, and minibatch evaluation.

The loop knows nothing about where a batch came from: an `InMemoryLoader` gathering from
RAM and a loader reading packed files feed it the same `Data` objects (NeighborLoader's
fields), so with the same model seed and the same samples they give the same losses.
Loss and accuracy use only the first `batch_size` rows of a batch (its seeds). A link task's batch
(``edge_label_index``, ``edge_label``) is scored on its pairs instead: the model's decoder scores
each pair from its ends' embeddings, the loss is binary cross-entropy on those logits, and
evaluation ranks each positive against its own negatives (`linkmetrics`).
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from ...errors import ConfigError, DiskflowError
from .heterobatch import hetero_batch
from .history import history_of
from .linkmetrics import link_figures
from .linkmodel import LinkModel
from .models import (
    BUILTINS,
    CLASSES_ATTRIBUTE,
    EdgeFreeMLP,
    hetero_of,
    spec_of,
    supports_trim,
    takes_edge_attr,
)
from .optim import Stepper
from .steps import DataParallel, StepGroups, draw_base, restore_rng, step_sizes

__all__ = ["checked_forward", "deterministic", "evaluate", "evaluate_link", "forward", "link_logits", "model_loss",
           "prior_weighted_loss", "train_epoch"]


@contextlib.contextmanager
def deterministic(enabled: bool = True) -> Iterator[None]:
    """Run the block with `torch.use_deterministic_algorithms(enabled)`, then restore the old setting.

    On CPU this costs next to nothing (uninitialised-memory filling is switched off); on
    CUDA it selects deterministic scatter kernels and needs cuBLAS's fixed workspace, which
    is requested here before the first cuBLAS call if the user has not set it.
    """
    import torch.utils.deterministic as tud

    was_on = torch.are_deterministic_algorithms_enabled()
    was_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = tud.fill_uninitialized_memory  # type: ignore[attr-defined]
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    tud.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_on, warn_only=was_warn)
        tud.fill_uninitialized_memory = was_fill  # type: ignore[attr-defined]


def forward(model: torch.nn.Module, batch: Data) -> torch.Tensor:
    """Logits of the batch's seeds: `model(x, edge_index)[:batch_size]` (features cast to float32).

    When the model allows it (`models.supports_trim`) and has one layer per sampled hop,
    the per-hop counts are passed too, so layer k skips what cannot reach the seeds: the
    same logits (bit for bit without dropout; dropout draws fewer masks) for less work. A
    model that reads a node's own row only (the edge-free MLP) sees the seeds' rows only,
    for the same reason.
    """
    x = batch.x.float()
    typed = hetero_of(model)
    if typed is not None:       # a typed graph: the flat batch split by type, the target type's logits
        layout, target = typed
        hb = hetero_batch(batch, layout, target, x=x, full_width=True)
        return model(hb.x_dict, hb.edge_index_dict)[target][:batch.batch_size]
    history = history_of(model)
    if history is not None:       # the batch's history plan, for training batches only
        history.bind(batch if model.training else None)
    spec = spec_of(model)
    inner = model.encoder if isinstance(model, LinkModel) else model
    if isinstance(inner, EdgeFreeMLP) or (spec is not None and spec.seeds_only):
        return model(x[:batch.batch_size])
    extra = {}
    edge_attr = getattr(batch, "edge_attr", None)
    if edge_attr is None and getattr(batch, "e_id", None) is not None and takes_edge_attr(model):
        # the graph has edge features (its samples keep e_id), and this loader does not serve them: refuse
        # rather than train the model without what it reads
        raise ConfigError("pipeline", "the model reads edge_attr, and its batches come without the graph's edge "
                                      "features (they keep e_id, but this loader does not serve edge rows)")
    if edge_attr is not None and takes_edge_attr(model):
        extra["edge_attr"] = edge_attr.float()      # cast as `x` is: a store may keep float16 rows
    hops = getattr(batch, "num_sampled_edges", None)
    if hops is not None and supports_trim(model) and len(hops) == getattr(model, "num_layers", len(hops)):
        out = model(x, batch.edge_index, num_sampled_nodes_per_hop=list(batch.num_sampled_nodes),
                    num_sampled_edges_per_hop=list(hops), **extra)
    else:
        out = model(x, batch.edge_index, **extra)
    return out[:batch.batch_size]


def link_logits(model: torch.nn.Module, batch: Data, position: int, what: str = "training") -> torch.Tensor:
    """A link batch's pair logits: the seeds' embeddings (`checked_forward`) scored by the model's decoder at
    ``edge_label_index``."""
    h = checked_forward(model, batch, position, what)
    if not isinstance(model, LinkModel):
        raise TypeError("a link batch needs a link task's model (an encoder and a decoder)")
    return model.score(h, batch.edge_label_index)


def checked_forward(model: torch.nn.Module, batch: Data, position: int, what: str = "training") -> torch.Tensor:
    """`forward`, with a user's model held to its contract: one line naming the model's file, the batch
    and the shapes it got when its forward raises or returns other than [seeds, classes] logits.

    Built-in models are not wrapped: their faults are diskflow's, and keep their tracebacks.

    Raises:
        InputError: (naming the model's file) the forward raised or returned the wrong shape.
    """
    spec = spec_of(model)
    if spec is None or BUILTINS.get(spec.name) is spec:
        return forward(model, batch)
    shapes = (f"x {list(batch.x.shape)} {str(batch.x.dtype).replace('torch.', '')}, "
              f"edge_index {list(batch.edge_index.shape)}, {int(batch.batch_size)} seeds")
    try:
        out = forward(model, batch)
    except DiskflowError:
        raise
    except Exception as e:
        raise spec.error(f"forward failed on {what} batch {position} ({shapes}): "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    classes = getattr(model, CLASSES_ATTRIBUTE, None)
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != int(batch.batch_size) \
            or (classes is not None and out.shape[1] != classes):
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        rows = f"embedding of {classes} channels" if isinstance(model, LinkModel) else f"row of {classes} class logits"
        raise spec.error(f"forward returned {got} on {what} batch {position} "
                         f"({shapes}); expected one {rows} per node of x")
    return out


def model_loss(model: torch.nn.Module, logits: torch.Tensor, target: torch.Tensor,
               label_prior: torch.Tensor | None, link: bool = False) -> torch.Tensor:
    """The batch's loss: the model's own (`Model.loss`) where it declares one, else cross-entropy,
    weighed by `label_prior` where given (`prior_weighted_loss`); with `link`, binary cross-entropy of the
    pairs' logits against their 0/1 labels."""
    spec = spec_of(model)
    if spec is not None and spec.loss is not None:
        return spec.loss(logits, target)
    if link:
        return F.binary_cross_entropy_with_logits(logits, target)
    return F.cross_entropy(logits, target) if label_prior is None else prior_weighted_loss(logits, target, label_prior)


def prior_weighted_loss(logits: torch.Tensor, target: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of a batch whose labels count as in the training split: the seeds of label c
    share ``prior[c]`` (renormalised over the labels the batch holds), so a batch with a skewed
    label mix (partition batches) estimates the split's loss; a batch that holds the labels in
    the split's proportions gets the plain mean."""
    per_seed = F.cross_entropy(logits, target, reduction="none")
    # one_hot + sum, not bincount: no device-to-host sync (bincount sizes its output from the max)
    counts = F.one_hot(target, prior.shape[0]).sum(0).to(per_seed.dtype)
    weight = prior[target].to(per_seed.dtype) / counts[target]
    return (weight * per_seed).sum() / weight.sum()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_epoch(model: torch.nn.Module, loader: Iterable[Data], optimizer: torch.optim.Optimizer | Stepper,
                device: str | torch.device, label_prior: torch.Tensor | None = None,
                steps: StepGroups | None = None, pass_batches: int | None = None) -> dict[str, Any]:
    """Train one epoch: forward, cross entropy on the seeds, backward, step, batch by batch.

    Args:
        model: called as `model(x, edge_index)`, already on `device`.
        loader: yields `Data` batches; if it has a `stage_s` dict (seconds per stage of the
            iteration it just ran, e.g. `sample`, `gather`), those are reported too.
        optimizer: steps `model`'s parameters: a torch optimizer, or a session's `optim.Stepper` (which
            also clips the gradients and steps a per-step learning-rate schedule).
        device: where the batch is moved before the forward pass.
        label_prior: the training split's label shares (on `device`): the loss is then
            `prior_weighted_loss` (partition batches); None: the plain mean cross-entropy.
        steps: how batches become optimizer steps (`steps.Accumulate`, `steps.DataParallel`);
            None: one step per batch.
        pass_batches: the batches of the whole pass over every rank (`steps.DataParallel` needs it:
            this rank's loader yields only its own share).

    Returns:
        `loss` (mean over seeds), `losses` (one float per batch, in order), `sizes` (each
        batch's seeds, in order), `train_acc` (accuracy on the seeds while training), `correct`
        (its numerator), `seeds`, `batches`, `seconds` (the epoch's wall time) and `stage_s`: the loader's stages, with the copy to the device added to
        `gather`, and `train` (forward, backward and step).
    """
    device = torch.device(device)
    model.train()
    link = isinstance(model, LinkModel)
    losses: list[float] = []
    sizes: list[int] = []
    total_loss = 0.0
    correct = 0
    seen = 0
    move_s = 0.0
    train_s = 0.0
    start = time.perf_counter()

    def backward(batch: Data) -> None:
        nonlocal move_s, train_s, total_loss, correct, seen
        t0 = time.perf_counter()
        batch = batch.to(device, non_blocking=True)
        _sync(device)
        t1 = time.perf_counter()
        if link:        # scored on its pairs: BCE on the logits, "accuracy" the pairs on the right side of 0
            logits = link_logits(model, batch, len(losses))
            target = batch.edge_label.to(logits.dtype)
            loss = model_loss(model, logits, target, None, link=True)
            size = int(target.numel())
        else:
            logits = checked_forward(model, batch, len(losses))
            target = batch.y[:batch.batch_size]
            loss = model_loss(model, logits, target, label_prior)
            size = int(batch.batch_size)
        loss.backward()
        value = float(loss.item())  # also waits for the device, so the train time is complete
        if link:
            hits = int(((logits.detach() > 0) == (target > 0.5)).sum())
        else:
            hits = int((logits.detach().argmax(dim=-1) == target).sum())
        move_s += t1 - t0
        train_s += time.perf_counter() - t1
        losses.append(value)
        sizes.append(size)
        total_loss += value * size
        correct += hits
        seen += size

    stepper = optimizer if isinstance(optimizer, Stepper) else _Plain(optimizer)
    if steps is None or steps.per_step == 1:
        for batch in loader:
            stepper.zero_grad()
            backward(batch)
            t2 = time.perf_counter()
            stepper.step()
            train_s += time.perf_counter() - t2
    else:
        train_s += _grouped_steps(model, iter(loader), stepper, device, steps, pass_batches, backward)
    seconds = time.perf_counter() - start
    stage_s = {name: float(s) for name, s in dict(getattr(loader, "stage_s", {})).items()}
    stage_s["gather"] = stage_s.get("gather", 0.0) + move_s
    stage_s["train"] = train_s
    return {
        "loss": total_loss / seen if seen else math.nan,
        "losses": losses,
        "sizes": sizes,
        "train_acc": correct / seen if seen else math.nan,
        "correct": correct,
        "seeds": seen,
        "batches": len(losses),
        "seconds": seconds,
        "stage_s": stage_s,
    }


class _Plain:
    """A bare torch optimizer as `train_epoch` steps it (no clipping, no schedule)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.optimizer.step()


def _grouped_steps(model: torch.nn.Module, batches: Iterator[Data], optimizer: Stepper | _Plain,
                   device: torch.device, steps: StepGroups, pass_batches: int | None,
                   backward: Any) -> float:
    """Several batches per optimizer step (`steps`); the seconds spent reducing and stepping."""
    params = [p for p in model.parameters() if p.requires_grad]
    spent = 0.0
    if isinstance(steps, DataParallel):
        if pass_batches is None:
            raise ValueError("data-parallel steps need the pass's batch count over all ranks")
        plan: Iterator[int] | None = iter(step_sizes(pass_batches, steps.world))
    else:
        plan = None
    pending: Data | None = None
    while True:
        if plan is not None:
            count = next(plan, None)
            if count is None:
                break
        else:             # a step starts only if a batch is left: the RNG draws one base per step taken
            pending = next(batches, None)
            if pending is None:
                break
            count = steps.per_step
        optimizer.zero_grad()
        base, after = draw_base(device)
        taken = 0
        for position in steps.local_positions(count):
            batch = pending if pending is not None else next(batches, None)
            pending = None
            if batch is None:
                if plan is not None:
                    raise ValueError(f"rank {getattr(steps, 'rank', 0)}: its loader ran out before its share of "
                                     f"a pass of {pass_batches} batches")
                break
            with steps.batch_rng(base, position):
                backward(batch)
            taken += 1
        restore_rng(after, device)
        t = time.perf_counter()
        steps.reduce(params, count if plan is not None else taken)
        optimizer.step()
        spent += time.perf_counter() - t
    if plan is not None and next(batches, None) is not None:
        raise ValueError(f"rank {getattr(steps, 'rank', 0)}: its loader holds more than its share of a pass of "
                         f"{pass_batches} batches")
    return spent


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Iterable[Data], device: str | torch.device) -> float:
    """Accuracy of `model` on the seeds of every batch of `loader` (minibatch inference; NaN if empty)."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    correct = 0
    seen = 0
    try:
        for position, batch in enumerate(loader):
            batch = batch.to(device, non_blocking=True)
            pred = checked_forward(model, batch, position, "evaluation").argmax(dim=-1)
            correct += int((pred == batch.y[:batch.batch_size]).sum())
            seen += batch.batch_size
    finally:
        model.train(was_training)
    return correct / seen if seen else math.nan


@torch.no_grad()
def evaluate_link(model: torch.nn.Module, loader: Iterable[Data], device: str | torch.device,
                  hits_k: int) -> dict[str, float]:
    """ROC-AUC, MRR and Hits@`hits_k` of a link model over every batch of `loader` (`linkmetrics`): each
    batch's pairs are its positives (label 1), then each positive's K negatives in turn
    (`prepare.task.eval_link_batches`). NaN for an empty split."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    pos: list[torch.Tensor] = []
    neg: list[torch.Tensor] = []
    width = None
    try:
        for position, batch in enumerate(loader):
            batch = batch.to(device, non_blocking=True)
            scores = link_logits(model, batch, position, "evaluation").float()
            positives = int((batch.edge_label > 0.5).sum())
            if positives == 0:
                continue
            k = (scores.shape[0] - positives) // positives
            if width is not None and k != width:
                raise ValueError(f"evaluation batch {position} has {k} negatives per positive, earlier ones {width}")
            width = k
            pos.append(scores[:positives].cpu())
            neg.append(scores[positives:].reshape(positives, k).cpu())
    finally:
        model.train(was_training)
    if not pos:
        return link_figures(np.zeros(0), np.zeros((0, 0)), hits_k)
    return link_figures(torch.cat(pos).numpy(), torch.cat(neg).numpy(), hits_k)
