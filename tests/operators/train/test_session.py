"""The one training session and its config: validation naming the option, one set of defaults, epochs
over several loaders, exact resume from `state_dict`, evaluation when due, the final block."""
from __future__ import annotations

import copy
import inspect
import math
import threading
from typing import Any

import pytest
import torch
from diskflow.operators.train.session import (
    EpochTally,
    TrainConfig,
    TrainSession,
    final_block,
    resolve_device,
    torch_threads,
)
from torch_geometric.data import Data

from diskflow.errors import ConfigError, InputError

DIM, CLASSES, STAGES = 7, 3, ("sample", "gather", "train")


@pytest.fixture(autouse=True)
def _one_thread():
    with torch_threads(1):
        yield


def batches(count: int = 6, seeds: int = 29, nodes: int = 61, seed: int = 5) -> list[Data]:
    """`count` batches shaped like NeighborLoader's: `seeds` seeds first among `nodes` rows, random edges."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n = nodes + i      # odd, different sizes
        edge_index = torch.stack([torch.randint(0, n, (4 * n,), generator=g), torch.randint(0, seeds, (4 * n,), generator=g)])
        out.append(Data(x=torch.randn(n, DIM, generator=g), edge_index=edge_index,
                        y=torch.randint(0, CLASSES, (n,), generator=g), batch_size=seeds - i))
    return out


def session(cfg: TrainConfig | None = None, **kw: Any) -> TrainSession:
    return TrainSession(cfg or TrainConfig(hidden=8, fanouts=(4, 4), epochs=2, lr=0.05, dropout=0.5, seed=3),
                        "cpu", DIM, CLASSES, stages=STAGES, **kw)


def strip_times(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("epoch_s", "stage_s", "seeds_per_s", "batches_per_s")}


# ------------------------------------------------------------------ TrainConfig

@pytest.mark.parametrize("options, option", [
    ({"model": "gin"}, "model"),
    ({"fanouts": ()}, "fanouts"),
    ({"fanouts": (5, -2)}, "fanouts"),
    ({"fanouts": (5, 2.5)}, "fanouts"),
    ({"hidden": 0}, "hidden"),
    ({"hidden": "8"}, "hidden"),
    ({"num_layers": 0}, "num_layers"),
    ({"batch_size": True}, "batch_size"),
    ({"epochs": 0}, "epochs"),
    ({"eval_every": -1}, "eval_every"),
    ({"heads": 0}, "heads"),
    ({"threads": 0}, "threads"),
    ({"threads": 1.5}, "threads"),
    ({"lr": 0.0}, "lr"),
    ({"lr": math.nan}, "lr"),
    ({"lr": True}, "lr"),
    ({"dropout": 1.0}, "dropout"),
    ({"seed": -1}, "seed"),
], ids=lambda v: str(v) if isinstance(v, str) else "-".join(f"{k}={w!r}" for k, w in v.items()))
def test_config_errors_name_the_option(options: dict[str, Any], option: str) -> None:
    with pytest.raises(ConfigError) as e:
        TrainConfig(**options)
    assert e.value.option == option
    assert str(e.value).startswith(f"{option}: ")


def test_config_fills_and_normalises() -> None:
    cfg = TrainConfig(fanouts=[4, 3.0, -1])     # type: ignore[arg-type]
    assert cfg.fanouts == (4, 3, -1) and all(type(f) is int for f in cfg.fanouts)
    assert cfg.num_layers == 3 and TrainConfig(fanouts=(2,), num_layers=4).num_layers == 4
    assert TrainConfig(model="none").data_only and not TrainConfig().data_only
    assert [e for e in range(5) if TrainConfig(epochs=5, eval_every=2).due(e)] == [1, 3, 4]
    assert "threads" not in TrainConfig(threads=2).resumable()
    assert TrainConfig(threads=2).resumable() == TrainConfig(threads=None).resumable()
    with pytest.raises(AttributeError):
        TrainConfig().hidden = 3     # type: ignore[misc]


def test_the_entry_points_take_their_defaults_from_the_config() -> None:
    """One place for the defaults: the trainers' keyword defaults are TrainConfig's."""
    from diskflow.flow.runtimes import memory as inmemory
    from diskflow.flow.runtimes.gathered import gathered_run
    from diskflow.operators.stream.train import StreamTrainConfig
    from diskflow.operators.train.trainer import train_packed

    defaults = TrainConfig()
    for fn in (inmemory.run, gathered_run, train_packed):
        params = inspect.signature(fn).parameters
        shared = [name for name in ("model", "hidden", "num_layers", "fanouts", "batch_size", "epochs", "lr",
                                    "dropout", "heads", "eval_every", "threads") if name in params]
        assert len(shared) >= 8
        for name in shared:
            if params[name].default is not inspect.Parameter.empty:
                assert params[name].default == TrainConfig.__dataclass_fields__[name].default, (fn, name)
    assert inspect.signature(inmemory.run).parameters["seed"].default == defaults.seed
    stream = StreamTrainConfig()
    assert {k: getattr(stream, k) for k in TrainConfig.__dataclass_fields__} == vars(defaults)
    with pytest.raises(ConfigError, match="^hidden"):
        StreamTrainConfig(hidden=0)     # validated on construction, on the client, like TrainConfig


def test_resolve_device() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    for bad, fault in (("tpu", "not a torch device"), ("meta", "expected 'cpu' or 'cuda")):
        with pytest.raises(ConfigError, match=f"^device: {fault}"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="^device: 'cuda:0' requested but CUDA is not available"):
            resolve_device("cuda:0")


# ------------------------------------------------------------------ TrainSession

def test_the_model_is_built_after_the_seed() -> None:
    a, b = session(), session()
    assert a.model is not None and b.model is not None
    assert all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    c = session(TrainConfig(hidden=8, fanouts=(4, 4), seed=4))
    assert c.model is not None
    assert not all(torch.equal(x, y) for x, y in zip(a.model.state_dict().values(), c.model.state_dict().values()))


def test_an_epoch_over_several_loaders_is_the_epoch_over_one() -> None:
    data = batches()
    one = session()         # the session draws from torch's global RNG (dropout): one after the other
    one.train(data)
    r1 = one.close_epoch(0)
    two = session()
    two.train(data[:2])
    two.train(data[2:])
    r2 = two.close_epoch(0)
    assert strip_times(r1) == strip_times(r2)
    sizes = [int(b.batch_size) for b in data]
    total = 0.0
    for value, size in zip(r1["losses"], sizes):
        total += value * size
    assert r1["loss"] == total / sum(sizes) and len(r1["losses"]) == len(data)
    assert 0.0 <= r1["train_acc"] <= 1.0
    assert set(r1["stage_s"]) == {*STAGES, "eval"}
    assert one.records == [r1] and one.tally.losses == []


class Lending:
    """A loader that lends its batches (as `PackedLoader` does): it logs each batch out and back in."""

    def __init__(self, data: list[Data]) -> None:
        self.data, self.log = data, []

    def __iter__(self):
        for i, b in enumerate(self.data):
            self.log.append(("out", i))
            yield b

    def release(self, batch: Data) -> None:
        self.log.append(("back", next(i for i, b in enumerate(self.data) if b is batch)))


def test_a_lending_loader_gets_each_batch_back_after_its_step() -> None:
    data = batches(4)
    loader = Lending(data)
    s = session()
    s.train(loader)
    assert loader.log == [(k, i) for i in range(4) for k in ("out", "back")]     # back before the next is taken
    assert len(s.tally.losses) == 4


def test_state_dict_round_trip_resumes_to_identical_losses() -> None:
    """Save mid-epoch, restore into a fresh session, finish: the same losses, records and weights, bit for bit."""
    data = batches()
    ref = session()
    for epoch in range(2):
        ref.train(data)
        ref.close_epoch(epoch)

    first = session()
    first.train(data[:4])
    saved = copy.deepcopy(first.state_dict())
    assert saved["partial"] is not None and len(saved["partial"]["losses"]) == 4 and saved["records"] == []
    del first
    torch.manual_seed(1234)       # whatever happened to the RNG meanwhile
    resumed = session()
    resumed.load_state_dict(saved)
    resumed.train(data[4:])
    resumed.close_epoch(0)
    resumed.train(data)
    resumed.close_epoch(1)
    assert [strip_times(r) for r in resumed.records] == [strip_times(r) for r in ref.records]
    assert ref.model is not None and resumed.model is not None
    assert all(torch.equal(x, y) for x, y in zip(ref.model.state_dict().values(), resumed.model.state_dict().values()))

    # and the control: without the restored state (weights, optimiser, RNG) the rest of the epoch differs
    fresh = session()
    fresh.train(data[4:])
    assert fresh.tally.losses != ref.records[0]["losses"][4:]
    rng_only = session()
    rng_only.load_state_dict({**saved, "rng": torch.manual_seed(99).get_state()})
    rng_only.train(data[4:])
    assert rng_only.tally.losses != ref.records[0]["losses"][4:], "dropout draws from the restored RNG"


def test_a_state_that_does_not_fit_is_a_corrupt_checkpoint() -> None:
    saved = session().state_dict()
    other = session(TrainConfig(hidden=16, fanouts=(4, 4), seed=3))
    with pytest.raises(InputError, match=r"ck-7: corrupt checkpoint: cannot restore the training state"):
        other.load_state_dict(saved, "ck-7")
    with pytest.raises(InputError, match="corrupt checkpoint"):
        session().load_state_dict({k: v for k, v in saved.items() if k != "rng"}, "ck-8")


def test_older_partial_epochs_load_without_io_counters() -> None:
    t = EpochTally.from_state(STAGES, {"losses": [1.0], "sizes": [3], "correct": 2, "seconds": 0.5,
                                       "stage_s": {"train": 0.25}})
    assert (t.bytes_read, t.requests, t.stage_s) == (0, 0, {"sample": 0.0, "gather": 0.0, "train": 0.25})
    assert EpochTally.from_state(STAGES, t.state()) == t
    assert EpochTally.from_state(STAGES, None) == EpochTally(STAGES)


def test_stop_ends_the_part_between_batches_and_counts_what_ran() -> None:
    data = batches()
    stop = threading.Event()
    s = session()
    seen: list[int] = []

    def on_batch(n: int) -> None:
        seen.append(n)
        if len(seen) == 2:
            stop.set()

    part = s.train(data, on_batch=on_batch, stop=stop)
    assert part["stopped"] and len(part["losses"]) == 2 and part["sizes"] == [29, 28] and seen == [1, 1]
    assert s.tally.sizes == [29, 28]
    assert not s.train(data[2:])["stopped"]
    assert len(s.close_epoch(0)["losses"]) == len(data)


def test_data_only_runs_the_loader_and_trains_nothing() -> None:
    s = session(TrainConfig(model="none", fanouts=(4, 4)), throughput=True)
    assert s.model is None and s.optimizer is None
    part = s.train(batches(3))
    assert part["losses"] == [] and part["seeds"] == 29 + 28 + 27
    s.count(bytes_read=4096, requests=2)
    r = s.close_epoch(0)
    assert r["loss"] is None and r["train_acc"] is None and r["val_acc"] is None
    assert r["bytes_read"] == 4096 and r["requests"] == 2 and r["batches_per_s"] > 0 and r["seeds_per_s"] > 0
    assert s.state_dict()["model"] == {} and s.state_dict()["partial"] is None


def test_evaluation_runs_when_due_on_loaders_built_once() -> None:
    data = batches()
    calls: list[int] = []

    def evals() -> dict[str, list[Data]]:
        calls.append(1)
        return {"val": data[:2], "test": data[2:4]}

    s = session(TrainConfig(hidden=8, fanouts=(4, 4), epochs=3, eval_every=2, seed=3), evals=evals)
    for epoch in range(3):
        s.train(data[:1])
        s.close_epoch(epoch)
    assert calls == [1]
    assert [r["val_acc"] is not None for r in s.records] == [False, True, True]
    assert all(0.0 <= r["test_acc"] <= 1.0 for r in s.records[1:])
    none = session(evals=dict)
    none.train(data[:1])
    assert none.close_epoch(1)["val_acc"] is None


def test_final_block() -> None:
    records = [{"epoch": 1, "val_acc": None, "test_acc": None, "epoch_s": 1.0},
               {"epoch": 2, "val_acc": 0.5, "test_acc": 0.4, "epoch_s": 2.0},
               {"epoch": 3, "val_acc": 0.5, "test_acc": 0.3, "epoch_s": 3.0},
               {"epoch": 4, "val_acc": 0.25, "test_acc": 0.2, "epoch_s": 6.0}]
    assert final_block(records) == {"test_acc": 0.2, "best_val_acc": 0.5, "best_epoch": 2, "test_acc_at_best_val": 0.4,
                                    "train_s": 12.0, "epoch_s_mean": 3.0}
    assert final_block([]) == {"test_acc": None, "best_val_acc": None, "best_epoch": None,
                               "test_acc_at_best_val": None, "train_s": 0, "epoch_s_mean": None}
