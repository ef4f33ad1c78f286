"""Optimizer steps over several batches: accumulation in one process equals data parallelism over ranks.

Two ranks (separate processes, gloo over a file rendezvous) each train their share of the same
passes; the test checks that both end with the same weights, that these equal one process
accumulating the same batches two per step, and that a short last step (5 batches, 2 ranks: the
second rank has no batch) keeps the ranks in step. Dropout is on (0.5): the per-step seeding must
give both layouts the same masks.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from diskflow.operators.train.loop import train_epoch
from diskflow.operators.train.models import build_model
from diskflow.operators.train.steps import Accumulate, step_sizes

PASSES = (5, 4)          # batches of each pass (a superbatch): 5 leaves rank 1 idle in the last step
DIM, CLASSES = 12, 3

CHILD = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    sys.path.insert(0, HERE)
    from test_grad_steps import batches, model_and_optimizer, PASSES
    from diskflow.operators.train.loop import train_epoch
    from diskflow.operators.train.steps import DataParallel
    rank, world, init, out, device = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)
    model, opt = model_and_optimizer(device)
    losses = []
    for p, n in enumerate(PASSES):
        mine = [b for i, b in enumerate(batches(p, n)) if i % world == rank]
        losses.append(train_epoch(model, mine, opt, device, steps=DataParallel(world, rank), pass_batches=n)["losses"])
    torch.save({"state": {k: v.cpu() for k, v in model.state_dict().items()}, "losses": losses}, out)
    dist.destroy_process_group()
""")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])     # gloo reduces CUDA tensors too


def batches(p: int, n: int) -> list:
    """Pass `p`'s `n` batches: small random graphs, seeds first (the same in every process)."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(1000 + p)
    out = []
    for i in range(n):
        nodes, edges, seeds = 30 + i, 90, 8
        x = torch.randn(nodes, DIM, generator=g)
        ei = torch.randint(0, nodes, (2, edges), generator=g)
        y = torch.randint(0, CLASSES, (nodes,), generator=g)
        out.append(Data(x=x, edge_index=ei, y=y, batch_size=seeds))
    return out


def model_and_optimizer(device: str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(7)
    model = build_model("sage", DIM, 16, CLASSES, 2, dropout=0.5).to(device)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def test_step_sizes():
    assert step_sizes(5, 2) == [2, 2, 1]
    assert step_sizes(4, 2) == [2, 2]
    assert step_sizes(1, 3) == [1]


def _accumulated(per_step: int, device: str = "cpu") -> tuple[dict[str, torch.Tensor], list[list[float]]]:
    model, opt = model_and_optimizer(device)
    losses = [train_epoch(model, batches(p, n), opt, device, steps=Accumulate(per_step))["losses"]
              for p, n in enumerate(PASSES)]
    return {k: v.cpu() for k, v in model.state_dict().items()}, losses


@pytest.mark.parametrize("device", DEVICES)
def test_data_parallel_equals_accumulation(tmp_path: Path, device: str):
    here = repr(str(Path(__file__).resolve().parent))
    world = 2
    outs = [tmp_path / f"rank{r}.pt" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-c", CHILD.replace("HERE", here), str(r), str(world),
                               str(tmp_path / "rendezvous"), str(outs[r]), device], stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    ranks = [torch.load(o, weights_only=True) for o in outs]
    for k, v in ranks[0]["state"].items():      # the ranks' weights are equal, bit for bit
        assert torch.equal(v, ranks[1]["state"][k]), k
    state, losses = _accumulated(world, device)
    for k, v in state.items():
        torch.testing.assert_close(ranks[0]["state"][k], v, rtol=1e-5, atol=1e-6)
    for p in range(len(PASSES)):                 # every batch's loss, rank by rank, as accumulated
        merged = [None] * PASSES[p]
        for r in range(world):
            merged[r::world] = ranks[r]["losses"][p]
        assert merged == pytest.approx(losses[p], rel=1e-5, abs=1e-6)


def test_accumulation_differs_from_one_step_per_batch():
    one, _ = model_and_optimizer()[0].state_dict(), None
    state2, _ = _accumulated(2)
    model, opt = model_and_optimizer()
    for p, n in enumerate(PASSES):
        train_epoch(model, batches(p, n), opt, "cpu")
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in state2.items())
    assert any(not torch.equal(v, state2[k]) for k, v in one.items())      # training moved the weights


def test_a_parameter_no_batch_used_keeps_no_gradient(tmp_path: Path):
    """A parameter unused by every batch of a step: no gradient after the reduction (Adam then leaves it
    alone, as it does when one process accumulates the step), on a one-rank gloo group."""
    import torch.distributed as dist
    from diskflow.operators.train.steps import DataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        used, unused = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
        (used * 2).sum().backward()
        DataParallel(1, 0).reduce([used, unused], 2)
        assert unused.grad is None and torch.equal(used.grad, torch.ones(3))
    finally:
        dist.destroy_process_group()
