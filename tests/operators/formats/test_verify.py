"""`verify` and `diskflow verify`: a good packed dataset passes; flipped bytes, truncation and a wrong index fail
with an error naming the file, the batch and the shard."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest
from diskflow.cli import verify as verify_cmd
from diskflow.operators.formats.manifest import read_manifest, write_manifest
from diskflow.operators.formats.packed import ROUND_DIR, SRC_DCACHE, SRC_PACKED, PackedDataset, index_name
from diskflow.operators.formats.packedindex import write_index_file
from diskflow.operators.formats.store import Store
from diskflow.operators.formats.verify import verify
from packed_rounds import build_packed, sample_round, tight_layout

from diskflow.errors import InputError


@pytest.fixture(scope="module")
def good(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packed dataset with GPU and CPU tiers and a segmented disk cache."""
    rnd = sample_round(tiny_store, tmp_path_factory.mktemp("round"))
    store = Store(tiny_store)
    out = tmp_path_factory.mktemp("packed") / "packed"
    build_packed(rnd, out, tight_layout(rnd, store.row_bytes, len(store.shards)))
    return out


@pytest.fixture
def copy(good: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "packed"
    shutil.copytree(good, dst)
    return dst


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def _a_packed_segment(ds: PackedDataset, batch_at_least: int = 5):
    for _, r in ds.batches():
        if r.batch >= batch_at_least and (r.seg_rows > 0).any():
            p = int(np.flatnonzero(r.seg_rows)[-1])
            return r, p
    raise AssertionError("no packed segment")


def test_a_good_dataset_verifies_in_full(good: Path) -> None:
    out = verify(good, full=True)
    ds = PackedDataset(good)
    assert out["batches"] == out["compared_batches"] == ds.num_batches
    assert out["dcache_files"] == len(ds.dcache_files) > 0 and out["dcache_bytes_checked"] > 0
    assert out["packed_bytes_checked"] == sum(int(r.seg_rows.sum()) for _, r in ds.batches()) * ds.row_bytes
    assert out["compared_rows"] == sum(r.src.shape[0] for _, r in ds.batches())


def test_sampled_verify_compares_only_the_sample(good: Path) -> None:
    out = verify(good, sample_batches=3, seed=1)
    assert out["compared_batches"] == 3 and 0 < out["compared_rows"]
    assert out["segments_checked"] == verify(good, full=True)["segments_checked"]   # crcs: always every segment


def test_flipped_byte_in_a_part_file_names_file_batch_and_shard(copy: Path) -> None:
    ds = PackedDataset(copy)
    r, p = _a_packed_segment(ds)
    ds.close()
    part = copy / ROUND_DIR / f"part-{p:05d}.bin"
    _flip(part, int(r.seg_offset[p]) + 7)
    with pytest.raises(InputError, match=f"checksum mismatch in batch {r.batch}, shard {p}") as e:
        verify(copy, sample_batches=1)
    assert e.value.path == str(part)


def test_flipped_byte_in_a_disk_cache_file_names_file_row_and_batch(copy: Path) -> None:
    ds = PackedDataset(copy)
    g = next(r.dcache for _, r in ds.batches() if r.dcache >= 0)
    row = next(int(r.idx[r.src == SRC_DCACHE][0]) for _, r in ds.batches() if r.dcache == g)
    path = ds.dcache_path(g)
    _flip(path, row * ds.row_bytes + 2)
    with pytest.raises(InputError, match=rf"checksum mismatch in disk-cache segment {g} .*row {row} .*batch \d+") as e:
        verify(copy)
    assert e.value.path == str(path)


def test_truncated_part_file_is_named(copy: Path) -> None:
    part = copy / ROUND_DIR / "part-00002.bin"
    data = part.read_bytes()
    part.write_bytes(data[:len(data) - 5000])
    with pytest.raises(InputError, match="truncated") as e:
        verify(copy)
    assert e.value.path == str(part)
    # the reader itself also refuses the short segment, naming batch and shard
    ds = PackedDataset(copy)
    with pytest.raises(InputError, match=r"truncated: batch \d+, shard 2"):
        for _ in ds.replay():
            pass
    ds.close()


def test_wrong_address_in_the_index_is_a_content_mismatch(copy: Path) -> None:
    ds = PackedDataset(copy)
    r, _ = _a_packed_segment(ds)
    key = next(sb.key for sb in ds.superbatches if sb.first_batch <= r.batch < sb.first_batch + sb.batches)
    records = ds.index(key)
    ds.close()
    rec = records[r.batch - records[0].batch]
    pos = np.flatnonzero(rec.src == SRC_PACKED)
    rec.idx = rec.idx.copy()                                # index arrays are read-only memory maps
    rec.idx[pos[[0, 1]]] = rec.idx[pos[[1, 0]]]           # two packed rows swapped: crcs still fine
    write_index_file(copy / ROUND_DIR / index_name(key), records)
    with pytest.raises(InputError, match=f"content mismatch in batch {r.batch}, shard") as e:
        verify(copy, full=True)
    assert "part-" in e.value.path


def test_flipped_byte_in_the_gpu_tier_is_found_by_full_verify(copy: Path) -> None:
    _flip(copy / "gpu_cache.npy", 4096 + 1)
    with pytest.raises(InputError, match="content mismatch in the GPU tier: row 0") as e:
        verify(copy, full=True)
    assert e.value.path.endswith("gpu_cache.npy")


def test_unfinished_or_foreign_directories_are_refused(copy: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no manifest.json"):
        verify(tmp_path / "nothing")
    manifest = read_manifest(copy)
    manifest["store"]["manifest_hash"] = "0" * 32
    write_manifest(copy, manifest)
    with pytest.raises(InputError, match="store changed since this dataset was packed"):
        verify(copy)
    manifest["files"]["parts"].pop()
    write_manifest(copy, manifest)
    with pytest.raises(InputError, match="part files for 5 shards"):
        verify(copy)


def test_cli_verify(good: Path, copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="diskflow")
    verify_cmd.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["verify", str(good), "--batches", "4", "--seed", "2"])
    assert args.func(args) == 0
    assert "OK" in capsys.readouterr().out
    (copy / ROUND_DIR / "part-00000.bin").write_bytes(b"")
    args = parser.parse_args(["verify", str(copy), "--full"])
    with pytest.raises(InputError, match="part-00000.bin: truncated"):
        args.func(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["verify", str(good), "--batches", "0"])


@pytest.mark.parametrize("victim", ["round-0/index/e0-s00001.arrow", "cpu_init.npy", "gpu_ids.npy",
                                    "round-0/dcache-00001.bin", "round-0/samples/e1-s00000.arrow"])
def test_truncated_files_are_named(copy: Path, victim: str) -> None:
    path = copy / victim
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(InputError) as e:
        verify(copy, full=True)
    assert e.value.path == str(path)
