"""Shared fixtures: small synthetic graphs made once per session (odd sizes on purpose)."""
from __future__ import annotations

from pathlib import Path

import dask
import pytest


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A raw dataset (edges/, features/, nodes/) of 4111 nodes with 47-dim features."""
    from diskflow.flow.synth import run_synth
    from diskflow.operators.synth import SynthConfig

    out = tmp_path_factory.mktemp("raw") / "tiny"
    with dask.config.set(scheduler="sync"):
        run_synth(SynthConfig(num_nodes=4111, feature_dim=47, num_classes=5, seed=7, part_nodes=1500), out)
    return out


@pytest.fixture(scope="session")
def tiny_store(tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_raw` ingested into a store, with feature shards of 1000 rows (so 5 shards)."""
    from diskflow.flow.ingest import run_ingest

    out = tmp_path_factory.mktemp("store") / "tiny"
    with dask.config.set(scheduler="sync"):
        run_ingest(tiny_raw, out, shard_rows=1000)
    return out
