"""docs/scaling.md's tables are what `diskflow.bench.scaling` computes from the results JSON they cite, never
typed by hand; every rate names a key that holds it; and the projection keeps the codec's sizes and the
orderings the page argues from (encoded rows take less disk, a faster disk is never slower)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from diskflow.bench import scaling

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rates() -> scaling.Rates:
    return scaling.load_rates()


def _between_markers(text: str) -> str:
    assert text.count(scaling.BEGIN) == 1 and text.count(scaling.END) == 1
    return text.split(scaling.BEGIN)[1].split(scaling.END)[0].strip("\n")


def test_the_page_holds_the_tables_the_cited_json_gives(rates: scaling.Rates) -> None:
    page = (ROOT / "docs" / "scaling.md").read_text()
    assert _between_markers(page) == scaling.render(rates), \
        "docs/scaling.md differs from the JSONs: run `python -m diskflow.bench.scaling`"
    assert scaling.main(["--check"]) == 0


def test_every_rate_is_read_from_the_key_it_cites(rates: scaling.Rates) -> None:
    for rate in rates.all():
        name, key = rate.source.split(" `figures.", 1)[0], rate.source.split("`figures.", 1)[1].split("`", 1)[0]
        data = json.loads((ROOT / "docs" / "results" / name).read_text())
        assert key in data["figures"], (rate.name, name, key)
        assert data["date"] in rate.measured and data["machine"] in rate.measured
    assert rates.packed.value < rates.accesses.value          # a miss is an access
    assert 0 < rates.loader.value <= 1.5 and 0 < rates.random.value < 1


def test_the_codecs_sizes_and_encoded_rows_take_less_disk(rates: scaling.Rates) -> None:
    for g in scaling.GRAPHS:
        exact, f16, int8 = (scaling.storage(g, e, rates) for e in scaling.ENCODINGS)
        assert int8.codec.row_bytes == g.dim + 4 and f16.codec.row_bytes == 2 * g.dim
        assert exact.codec.row_bytes == g.dim * (4 if g.dtype == "float32" else 2)
        assert exact.features == g.rows * exact.codec.row_bytes
        assert int8.store < f16.store <= exact.store and int8.packs < f16.packs <= exact.packs
        assert int8.scratch < exact.scratch and int8.tier < exact.tier and int8.cached >= exact.cached
        assert exact.topology == 8 * (g.nodes + 1) + 2 * g.edges * 4      # int32 indices below 2**31 nodes
        # float16 rows halve a float32 store's rows and leave a float16 store's (MAG240M's) as they are
        assert f16.features * (2 if g.dtype == "float32" else 1) == exact.features


def test_a_faster_disk_is_never_slower_and_the_store_off_the_box_never_hurts(rates: scaling.Rates) -> None:
    for g in scaling.GRAPHS:
        for enc in scaling.ENCODINGS:
            s = scaling.storage(g, enc, rates)
            slow, fast = (scaling.epoch(s, bw, rates) for bw in sorted(scaling.DISK_BANDWIDTHS))
            assert fast.box_s <= slow.box_s and fast.split_s <= slow.split_s
            assert slow.split_s <= slow.box_s and slow.workers >= 1 and slow.box_workers >= 1
            assert (slow.store_reads == 0) == (s.cached == 1)


def test_pages_per_row() -> None:
    assert scaling.pages_per_row(512) == 1 and scaling.pages_per_row(4096) == 1
    assert scaling.pages_per_row(1536) == 1.25 and scaling.pages_per_row(8192) == 2


def test_a_results_file_from_another_shape_is_refused(tmp_path: Path) -> None:
    for f in ("compare", "prepare", "reader", "stream.h200"):
        shutil.copy(ROOT / "docs" / "results" / f"{f}.json", tmp_path / f"{f}.json")
    data = json.loads((tmp_path / "compare.json").read_text())
    data["command"] += " --nodes 2000000"
    (tmp_path / "compare.json").write_text(json.dumps(data))
    with pytest.raises(scaling.ScalingError, match="--nodes"):
        scaling.load_rates(tmp_path)
    data["command"] = data["command"].replace(" --nodes 2000000", "")
    data["setup"] = data["setup"].replace("2 epochs", "3 epochs")
    (tmp_path / "compare.json").write_text(json.dumps(data))
    with pytest.raises(scaling.ScalingError, match="2 epochs"):
        scaling.load_rates(tmp_path)
