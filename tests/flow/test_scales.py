"""The int8 column scales of a store as a Dask graph: one task per feature shard and a pairwise tree of
merges under readable keys, equal to numpy's absmax over every row (local scheduler and a client not set
as default); a NaN or infinite feature named by shard file and row; float16 stores; chunked reductions."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
from diskflow.flow.ingest import run_ingest
from diskflow.flow.scales import int8_scales, store_absmax
from diskflow.operators.formats.rowcodec import column_scales
from diskflow.operators.formats.store import SPLITS, Store
from diskflow.operators.ingest.raw import write_raw_dataset
from diskflow.operators.prepare.scales import ColumnStats, array_absmax, combine_stats, shard_stats
from task_keys import TaskKeys

from diskflow.errors import InputError

N, E, DIM = 1013, 3001, 7


def _store(tmp: Path, x: np.ndarray, shard_rows: int = 300) -> Path:
    """A store of features `x` ([N, DIM]; NaN and inf kept) over a random graph, in shards of `shard_rows`."""
    rng = np.random.default_rng(0)
    raw = write_raw_dataset(tmp / "raw", src=rng.integers(0, N, E), dst=rng.integers(0, N, E), features=x,
                            labels=rng.integers(0, 4, N), splits=rng.choice(list(SPLITS), N), feature_parts=3)
    with dask.config.set(scheduler="sync"):
        run_ingest(raw, tmp / "store", shard_rows=shard_rows, allow_nonfinite=True)
    return tmp / "store"


def _features(dtype: type = np.float32) -> np.ndarray:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, DIM)).astype(np.float32)
    x[700, 3] = -900.0                           # an outlier in the last shard but one
    x[:, 5] = 0                                  # a zero column: scale 0
    return x.astype(dtype)


def test_scales_equal_numpy_over_every_row_one_task_per_shard(tiny_store: Path) -> None:
    store = Store(tiny_store)
    x = store.read_features()
    with dask.config.set(scheduler="sync"), TaskKeys() as seen:
        scales = int8_scales(tiny_store)
    assert scales.dtype == np.float32 and np.array_equal(scales, column_scales(np.abs(x).max(axis=0)))
    tok = seen.keys[0].rsplit("-", 1)[1]
    assert sorted(seen.keys) == sorted([f"scales-p{p}-{tok}" for p in range(5)] +
                                       [f"scales-merge-0-0-{tok}", f"scales-merge-0-1-{tok}",
                                        f"scales-merge-1-0-{tok}", f"scales-merge-2-0-{tok}"])
    assert seen.groups() == {"scales", "scales-merge"}
    with dask.config.set(scheduler="sync"):
        stats = store_absmax(tiny_store)
    assert np.array_equal(stats.absmax, np.abs(x).max(axis=0))
    assert (stats.rows, stats.bytes_read) == (4111, x.nbytes)


def test_shard_partials_combine_in_any_order(tiny_store: Path) -> None:
    x = Store(tiny_store).read_features()
    parts = [shard_stats(str(tiny_store), p) for p in range(5)]
    assert [p.rows for p in parts] == [1000, 1000, 1000, 1000, 111]
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
        total = combine_stats(*(parts[i] for i in order))
        assert np.array_equal(total.absmax, np.abs(x).max(axis=0)) and total.rows == 4111
    assert np.array_equal(combine_stats(combine_stats(*parts[:3]), combine_stats(*parts[3:])).absmax,
                          combine_stats(*parts).absmax)
    with pytest.raises(ValueError, match="different widths"):
        combine_stats(parts[0], ColumnStats(np.zeros(3, np.float32), 1))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_a_store_of_either_dtype_with_a_zero_column(tmp_path: Path, dtype: type) -> None:
    x = _features(dtype)
    path = _store(tmp_path, x)
    assert Store(path).feature_dtype == dtype
    with dask.config.set(scheduler="sync"):
        scales = int8_scales(path)
    assert np.array_equal(scales, column_scales(np.abs(x.astype(np.float32)).max(axis=0)))
    assert scales[5] == 0 and scales[3] >= np.float32(900 / 127)


@pytest.mark.parametrize("value", [np.nan, np.inf], ids=["nan", "inf"])
def test_a_non_finite_feature_is_named_by_shard_file_and_row(tmp_path: Path, value: float) -> None:
    x = _features()
    x[546, 2] = value
    x[580, 1] = value                            # a later one in the same shard: the first is named
    path = _store(tmp_path, x)
    pattern = (rf"features/part-00001\.npy: non-finite feature value {value!r} at row 246 \(node 546\), column 2: "
               r"int8 scales need finite features$")
    with dask.config.set(scheduler="sync"), pytest.raises(InputError, match=pattern):
        int8_scales(path)


def test_a_client_not_set_as_default_runs_the_graph(tiny_store: Path) -> None:
    distributed = pytest.importorskip("distributed")
    x = Store(tiny_store).read_features()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as c, \
            distributed.Client(c, set_as_default=False) as client:
        with distributed.get_task_stream(client) as stream:
            scales = int8_scales(tiny_store, client)
        assert {str(t["key"]).rsplit("-", 1)[0] for t in stream.data} >= {f"scales-p{p}" for p in range(5)}
    assert np.array_equal(scales, column_scales(np.abs(x).max(axis=0)))


def test_array_absmax_in_chunks() -> None:
    x = _features()
    for chunk_bytes in (1, DIM * 4 * 10, 1 << 20):
        assert np.array_equal(array_absmax(x, chunk_bytes=chunk_bytes), np.abs(x).max(axis=0))
    assert np.array_equal(array_absmax(np.zeros((0, DIM), np.float32)), np.zeros(DIM, np.float32))
    x[1001, 6] = -np.inf
    with pytest.raises(InputError, match=r"^shard\.npy: non-finite feature value -inf at row 1001 \(node 2001\), "
                                         r"column 6"):
        array_absmax(x, "shard.npy", first_node=1000, chunk_bytes=DIM * 4 * 10)
