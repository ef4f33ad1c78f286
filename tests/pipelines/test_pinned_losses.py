"""The losses every pipeline trains to, pinned: one seed, one tiny graph, the same bits as before a refactor.

The trainers share one training session, so their losses equal each other's batch for batch (the
other tests check that); this file pins the values themselves, as exact hex floats, so a change
that moved all of them at once (a different seed order, an extra RNG draw, a reordered sum) is
caught too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from diskflow.flow.rundir import new_run_dir
from diskflow.pipelines import belady, diskgnn, ginex, inmemory

SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 16, "fanouts": (5, 5), "batch_size": 256, "epochs": 2,
                            "lr": 0.01, "dropout": 0.2, "seed": 1, "threads": 1, "superbatch_size": 3}

# inmemory.run(tiny_store, ..., **SETTINGS): every batch's loss of both epochs, then the final test accuracy
PINNED_LOSSES: list[str] = [
    "0x1.a1d0780000000p+0",
    "0x1.9750b40000000p+0",
    "0x1.8b7d780000000p+0",
    "0x1.8b95840000000p+0",
    "0x1.7e4f6c0000000p+0",
    "0x1.75aee60000000p+0",
    "0x1.6f94c40000000p+0",
    "0x1.68b89e0000000p+0",
    "0x1.53ecf20000000p+0",
    "0x1.3a5eca0000000p+0",
    "0x1.2cf9880000000p+0",
    "0x1.2695e60000000p+0",
    "0x1.1ea44a0000000p+0",
    "0x1.0a1f5c0000000p+0",
    "0x1.fad3800000000p-1",
    "0x1.e35a3a0000000p-1",
    "0x1.c9598e0000000p-1",
    "0x1.c66a840000000p-1",
    "0x1.8d3f660000000p-1",
    "0x1.89d1900000000p-1",
]
PINNED_TEST_ACC = "0x1.8618618618618p-1"


pytestmark = pytest.mark.usefixtures("one_torch_thread", "sync_dask")


def _hex(report: dict[str, Any]) -> tuple[list[str], str]:
    return [float(x).hex() for e in report["epochs"] for x in e["losses"]], float(report["final"]["test_acc"]).hex()


@pytest.mark.parametrize("pipeline", [inmemory, belady, diskgnn, ginex], ids=["inmemory", "belady", "diskgnn", "ginex"])
def test_losses_are_pinned(pipeline: Any, tiny_store: Path, tmp_path: Path) -> None:
    extra = {} if pipeline is inmemory else {"cpu_memory": "12MiB"}
    if pipeline is inmemory:
        settings = {k: v for k, v in SETTINGS.items() if k != "superbatch_size"}
    else:
        settings = SETTINGS
    report = pipeline.run(tiny_store, new_run_dir(tmp_path, pipeline.NAME), progress=False, **settings, **extra)
    losses, acc = _hex(report)
    assert losses == PINNED_LOSSES
    assert acc == PINNED_TEST_ACC


def test_streaming_is_pinned(tiny_store: Path, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    from diskflow.pipelines import streaming

    report = streaming.run(tiny_store, new_run_dir(tmp_path, "stream"), window=2, quota="3MiB", workers=1,
                           processes=False, progress=False, **SETTINGS)
    losses, acc = _hex(report)
    assert losses == PINNED_LOSSES
    assert acc == PINNED_TEST_ACC
