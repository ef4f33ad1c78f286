"""Shared fixtures: small synthetic graphs made once per session (odd sizes on purpose)."""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import dask
import pytest

with warnings.catch_warnings():  # importing torch_geometric calls torch.jit.script, deprecated in torch 2.13
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch_geometric.nn  # noqa: F401  (once, here: every test module may then import it)


# Test files taking some 10 s or more on 2 cores (seconds, summed over their tests, measured 2026-12-05). `make
# test` runs one file at a time in each of two processes (--dist loadfile); these go first, the heaviest first, so
# that the run does not end with one process on a long file while the other waits. (xdist's own order, files with
# the most tests first, put the longest single-test files last.) Only the order of files changes, never a verdict;
# a file missing here, or a weight grown stale, only costs balance.
HEAVY_FIRST = {
    "flow/test_many_gpu_workers.py": 48, "flow/test_edge_features.py": 39, "bench/test_bench_scale.py": 38,
    "bench/test_bench_compare.py": 34, "flow/test_link_task.py": 22, "operators/train/test_load.py": 32,
    "flow/test_hetero_pipelines.py": 30, "test_imports.py": 25, "pipelines/test_user_model.py": 24,
    "pipelines/test_user_optimizer.py": 23, "flow/test_two_machines.py": 23, "test_readme.py": 21,
    "bench/test_bench_pyg.py": 16, "flow/test_stream.py": 16,
    "flow/test_dashboard.py": 15, "flow/test_encoded_rows.py": 14, "flow/test_prepare.py": 14,
    "flow/test_prepare_history.py": 13, "bench/test_bench_stream_gpus.py": 13, "flow/test_prepare_messages.py": 11,
    "test_user_guide.py": 9, "flow/test_full_disk.py": 9,
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "plots: the module checks the figures runs draw (rendered for real)")
    if getattr(config.option, "dist", None) == "loadfile":
        config.option.loadscopereorder = False      # files in collection order: `pytest_collection_modifyitems`'s


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of `HEAVY_FIRST` first, heaviest first; the others after them, in their order (a stable sort, so
    each file's tests keep theirs)."""
    here = Path(__file__).parent

    def weight(item: pytest.Item) -> int:
        try:
            return HEAVY_FIRST.get(item.path.relative_to(here).as_posix(), 0)
        except ValueError:
            return 0
    items.sort(key=lambda item: -weight(item))


def _save_unrendered(fig: object, fname: object, *args: object, **kwargs: object) -> None:
    if isinstance(fname, (str, os.PathLike)):
        open(fname, "wb").close()          # the file, empty: nothing is drawn


@pytest.fixture(scope="module", autouse=True)
def _figures_unrendered(request: pytest.FixtureRequest) -> Iterator[None]:
    """Figures (curves.png, timeline.png, the memory split's) are built but not drawn: their layout and
    savefig write an empty file. Drawing costs about 0.3 s a figure, and the suite's runs save some 130
    that only a few modules look at; those are marked ``pytestmark = pytest.mark.plots`` and draw them."""
    if request.node.get_closest_marker("plots") is not None:
        yield
        return
    from matplotlib.figure import Figure

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Figure, "savefig", _save_unrendered)
        mp.setattr(Figure, "tight_layout", lambda *args, **kwargs: None)
        yield


@pytest.fixture(scope="session")
def tiny_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A raw dataset (edges/, features/, nodes/) of 4111 nodes with 47-dim features. Its class signal and
    homophily are given (the generator's defaults before 2026-11-28), so the losses pinned on it stay."""
    from diskflow.flow.synth import run_synth
    from diskflow.operators.ingest.synth import SynthConfig

    out = tmp_path_factory.mktemp("raw") / "tiny"
    with dask.config.set(scheduler="sync"):
        run_synth(SynthConfig(num_nodes=4111, feature_dim=47, num_classes=5, seed=7, part_nodes=1500,
                               homophily=0.75, signal=1.0), out)
    return out


@pytest.fixture(scope="session")
def tiny_store(tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_raw` ingested into a store, with feature shards of 1000 rows (so 5 shards)."""
    from diskflow.flow.ingest import run_ingest

    out = tmp_path_factory.mktemp("store") / "tiny"
    with dask.config.set(scheduler="sync"):
        run_ingest(tiny_raw, out, shard_rows=1000)
    return out


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for the test (small graphs train fastest so, and the machine is shared)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def sync_dask() -> Iterator[None]:
    """Dask's synchronous scheduler for the test (graphs run in the test's thread, in order)."""
    with dask.config.set(scheduler="sync"):
        yield


class SmallDisk:
    """A 20 MiB tmpfs mounted for one test: a real filesystem that fills up (ENOSPC), with `fill`."""

    SIZE = 20 << 20

    def __init__(self, root: Path) -> None:
        self.root = root

    def free(self) -> int:
        import shutil

        return shutil.disk_usage(self.root).free

    def fill(self, leave: int) -> None:
        """Take all but `leave` bytes (rounded to pages) with a filler file."""
        filler = self.root / "filler.bin"
        filler.unlink(missing_ok=True)
        take = max(0, self.free() - int(leave))
        with open(filler, "wb") as f:
            f.write(b"\0" * take)

    def manifests(self) -> list[Path]:
        """Every manifest.json under the mount (valid-looking outputs)."""
        return sorted(self.root.rglob("manifest.json"))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 20 MiB tmpfs at tmp_path/disk (tests and CI run as root); skipped where mounting is not permitted."""
    import os
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (tests and CI run as root)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SmallDisk.SIZE}", "tmpfs", str(mnt)],
                       check=False, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {r.stderr.strip() or r.returncode}")
    try:
        yield SmallDisk(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)
