"""Node ids and index addresses are stored as int32 below 2**31 nodes, int64 beyond; readers take both."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from diskflow.operators.formats.packedindex import (
    INDEX_SCHEMA,
    INDEX_SCHEMA_INT32,
    IndexRecord,
    index_bytes,
    read_index_file,
)
from diskflow.operators.formats.samples import (
    SCHEMA,
    SCHEMA_INT32,
    id_type,
    read_n_ids,
    read_samples,
    record_batch,
    samples_bytes,
)
from diskflow.operators.prepare.sample import SampledBatch

from diskflow.errors import InputError


def test_the_id_type_follows_the_graph_size() -> None:
    assert id_type(1) == id_type(2**31) == pa.int32()          # ids 0 .. 2**31 - 1
    assert id_type(2**31 + 1) == id_type(2**40) == pa.int64()


def _sampled(ids: list[int]) -> SampledBatch:
    n = len(ids)
    edges = np.array([np.arange(1, n), np.zeros(n - 1, np.int64)], np.int64)
    return SampledBatch(np.array(ids, np.int64), edges, [1, n - 1], [n - 1], 1)


@pytest.mark.parametrize("ids", [pa.int32(), pa.int64()], ids=["int32", "int64"])
def test_samples_read_back_in_either_layout(ids: pa.DataType) -> None:
    batches = [_sampled([7, 3, 2**31 - 1, 0]), _sampled([5, 6])]
    data = samples_bytes([record_batch(j, b, ids) for j, b in enumerate(batches)])
    expect = SCHEMA_INT32 if ids == pa.int32() else SCHEMA
    assert pa.ipc.open_file(pa.BufferReader(data)).schema.remove_metadata().equals(expect)
    got = list(read_samples("mem", data.to_pybytes()))
    for rec, b in zip(got, batches, strict=True):
        assert rec.n_id.dtype == ids.to_pandas_dtype()
        assert np.array_equal(rec.n_id, b.n_id) and np.array_equal(rec.edge_index, b.edge_index)
    assert [n.tolist() for n in read_n_ids("mem", data.to_pybytes())] == [b.n_id.tolist() for b in batches]


def test_int32_samples_refuse_ids_beyond_it() -> None:
    with pytest.raises(ValueError, match="int32"):
        record_batch(0, _sampled([1, 2**31]), pa.int32())
    assert record_batch(0, _sampled([1, 2**31]), pa.int64()).schema.equals(SCHEMA)


def test_an_unknown_samples_schema_is_an_input_error(tmp_path: Path) -> None:
    table = pa.table({"n_id": pa.array([[1, 2]], pa.large_list(pa.int16()))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(InputError, match="unexpected samples schema"):
        list(read_samples(tmp_path / "x.arrow", sink.getvalue().to_pybytes()))


def _record(batch: int, idx: list[int]) -> IndexRecord:
    n = len(idx)
    return IndexRecord(batch=batch, epoch=0, src=np.ones(n, np.uint8), idx=np.array(idx, np.int64),
                       insert_pos=np.zeros(0, np.int64), insert_slot=np.zeros(0, np.int64),
                       seg_offset=np.zeros(1, np.int64), seg_rows=np.zeros(1, np.int64), seg_crc=np.zeros(1, np.uint32),
                       dcache=-1)


@pytest.mark.parametrize("top", [2**31 - 1, 2**31], ids=["fits-int32", "needs-int64"])
def test_index_addresses_take_the_narrowest_type(top: int) -> None:
    records = [_record(0, [0, 5, top]), _record(1, [])]
    data = index_bytes(records).to_pybytes()
    schema = pa.ipc.open_file(pa.BufferReader(data)).schema.remove_metadata()
    assert schema.equals(INDEX_SCHEMA_INT32 if top < 2**31 else INDEX_SCHEMA)
    back = read_index_file("mem", data)
    assert [r.idx.tolist() for r in back] == [[0, 5, top], []]
    assert back[0].idx.dtype == (np.int32 if top < 2**31 else np.int64)
