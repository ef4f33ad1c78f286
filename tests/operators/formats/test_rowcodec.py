"""The row codec: every encoding keeps its stated error bound on rows with outliers, zero and constant
columns, zero rows and subnormals; exact is bit-exact; NaN and values out of range are refused naming the
row and column; numpy and torch decode to the same bits, from typed rows or raw bytes; the manifest and a
pickle give the codec back."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from diskflow.operators.formats.rowcodec import (
    BFLOAT16_LIMIT,
    DEFAULT_SCALE_MODE,
    ENCODINGS,
    FLOAT16_LIMIT,
    RowCodec,
    column_scales,
    make_codec,
)

from diskflow.errors import InputError

N, DIM = 4111, 47       # odd sizes: nothing lines up by accident
CODECS = [("exact", None), ("float16", None), ("bfloat16", None), ("int8", "row"), ("int8", "column")]
IDS = ["exact", "float16", "bfloat16", "int8-row", "int8-column"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


def _rows(dtype: type = np.float32) -> np.ndarray:
    """Gaussian rows with a few large outliers, a zero column, a constant column, a zero row, a row of
    subnormal float32 values and one of tiny normals."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, DIM)).astype(np.float32)
    x[rng.integers(0, N, 9), rng.integers(0, DIM, 9)] = rng.choice([-1, 1], 9) * rng.uniform(500, 5000, 9)
    x[18] = rng.uniform(-1, 1, DIM) * np.float32(1e-40)      # float32 subnormals
    x[19] = rng.uniform(-1, 1, DIM) * np.float32(1e-7)
    x[:, 5] = 0
    x[:, 6] = -3.25
    x[17] = 0
    return x.astype(dtype)


def _codec(encoding: str, mode: str | None, x: np.ndarray) -> RowCodec:
    return make_codec(encoding, DIM, x.dtype, scale_mode=mode or DEFAULT_SCALE_MODE, absmax=_absmax(x))


def _absmax(x: np.ndarray) -> np.ndarray:
    return np.abs(x.astype(np.float32)).max(axis=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize(("encoding", "mode"), CODECS, ids=IDS)
def test_decoded_rows_keep_the_stated_bound(encoding: str, mode: str | None, dtype: type) -> None:
    x = _rows(dtype)
    codec = _codec(encoding, mode, x)
    enc = codec.encode(x)
    assert enc.dtype == codec.encoded_dtype and enc.shape == (N, codec.row_bytes // codec.encoded_dtype.itemsize)
    out = codec.decode_numpy(enc)
    assert out.dtype == np.float32 and out.shape == (N, DIM)
    err = np.abs(out.astype(np.float64) - x.astype(np.float64))
    assert (err <= codec.value_bound(x)).all()
    per_column = codec.bound(_absmax(x))
    assert per_column.shape == (DIM,) and (err <= per_column).all()
    assert (out[:, 5] == 0).all() and (out[17] == 0).all()          # zero column and zero row: exact zeros
    if encoding != "exact" and not (encoding == "float16" and dtype is np.float16):
        assert err.max() > 0                                        # lossy, and the test would see it


def test_exact_returns_the_rows_themselves_nan_payloads_included() -> None:
    x = _rows()
    x.view(np.uint32)[3, 4] = 0x7FC0_1234          # a NaN with a payload
    codec = make_codec("exact", DIM)
    enc = codec.encode(x)
    assert enc is x and codec.decode_numpy(enc) is x
    assert np.array_equal(codec.decode_numpy(enc.view(np.uint8)).view(np.uint32), x.view(np.uint32))
    assert torch.equal(codec.decode_torch(torch.from_numpy(x)).view(torch.int32), torch.from_numpy(x).view(torch.int32))
    assert (codec.row_bytes, codec.ratio) == (DIM * 4, 1.0)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(("encoding", "mode"), CODECS[1:], ids=IDS[1:])
def test_lossy_encodings_refuse_non_finite_values_naming_row_and_column(encoding: str, mode: str | None,
                                                                        value: float) -> None:
    x = _rows()
    codec = _codec(encoding, mode, x)
    x[1234, 40] = value
    x[2000, 1] = value
    with pytest.raises(InputError, match=r"^part-00003\.npy: non-finite value (nan|inf|-inf) at row 4234, column 40;"):
        codec.encode(x, where="part-00003.npy", first_row=3000)


def test_float16_and_bfloat16_refuse_values_that_round_to_infinity() -> None:
    x = np.zeros((3, DIM), np.float32)
    x[2, 9] = np.nextafter(np.float32(FLOAT16_LIMIT), np.float32(0))    # the largest that rounds to 65504
    assert make_codec("float16", DIM).decode_numpy(make_codec("float16", DIM).encode(x))[2, 9] == 65504
    x[1, 7] = -FLOAT16_LIMIT
    with pytest.raises(InputError, match=r"^rows: value beyond float16's range -65520\.0 at row 1, column 7"):
        make_codec("float16", DIM).encode(x)
    y = np.zeros((2, DIM), np.float32)
    y[0, 0] = np.nextafter(np.float32(BFLOAT16_LIMIT), np.float32(0))
    bf = make_codec("bfloat16", DIM)
    assert np.isfinite(bf.decode_numpy(bf.encode(y))).all()
    y[1, 3] = BFLOAT16_LIMIT
    with pytest.raises(InputError, match=r"value beyond bfloat16's range .* at row 1, column 3"):
        bf.encode(y)


def test_int8_column_refuses_a_value_beyond_the_scales_it_was_given() -> None:
    x = _rows()
    codec = make_codec("int8", DIM, scale_mode="column", absmax=_absmax(x))
    y = x[:10].copy()
    y[4, 2] = _absmax(x)[2] * 1.01
    with pytest.raises(InputError, match=r"at row 4, column 2 is beyond its column's int8 range"):
        codec.encode(y)
    y[4, 2] = 0
    y[7, 5] = 1e-30                                   # column 5 is all zeros: its scale is 0
    with pytest.raises(InputError, match=r"at row 7, column 5 is beyond its column's int8 range"):
        codec.encode(y)


def test_zero_and_subnormal_maxima_give_scales_without_dividing_by_zero() -> None:
    absmax = np.array([0, 1e-45, 1e-44, 3e-39, 1, 127, 3e38], np.float32)
    s = column_scales(absmax)
    assert s.dtype == np.float32 and s[0] == 0 and (s[1:] > 0).all()
    assert (s.astype(np.float64) * 127 >= absmax).all()         # no value of a column passes 127 steps
    x = np.vstack([absmax, -absmax, absmax / 3]).astype(np.float32)
    codec = RowCodec("int8", np.dtype(np.float32), 7, "column", s)
    err = np.abs(codec.decode_numpy(codec.encode(x)).astype(np.float64) - x)
    assert (err <= codec.bound()).all()
    with pytest.raises(ValueError, match="finite values >= 0"):
        column_scales(np.array([1.0, np.nan]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("encoding", "mode"), CODECS, ids=IDS)
def test_torch_decodes_the_same_bits_as_numpy_from_typed_rows_and_raw_bytes(encoding: str, mode: str | None,
                                                                          device: str) -> None:
    x = _rows()
    codec = _codec(encoding, mode, x)
    enc = codec.encode(x)
    want = codec.decode_numpy(enc)
    raw = enc.view(np.uint8).reshape(N, codec.row_bytes)
    assert np.array_equal(codec.decode_numpy(raw), want)
    for t in (torch.from_numpy(enc), torch.from_numpy(raw)):
        got = codec.decode_torch(t.to(device))
        assert got.dtype == torch.float32 and got.device.type == device
        assert torch.equal(got.cpu(), torch.from_numpy(want))
    sliced = torch.from_numpy(raw[100:300]).to(device)           # a slice: an offset into the storage
    assert torch.equal(codec.decode_torch(sliced).cpu(), torch.from_numpy(want[100:300]))
    out = torch.full((N, DIM), 7.0, device=device)               # decoded into a reused tensor: the same bits
    assert codec.decode_torch(torch.from_numpy(raw).to(device), out=out) is out
    assert torch.equal(out.cpu(), torch.from_numpy(want))
    with pytest.raises(ValueError, match="out: expected float32"):
        codec.decode_torch(torch.from_numpy(raw).to(device), out=out[:10])


def test_sizes_manifest_and_pickle() -> None:
    x = _rows()
    sizes = {}
    for encoding, mode in CODECS:
        codec = _codec(encoding, mode, x)
        entry = json.loads(json.dumps(codec.to_manifest()))
        assert RowCodec.from_manifest(entry) == codec and pickle.loads(pickle.dumps(codec)) == codec
        assert entry["row_bytes"] == codec.row_bytes
        sizes[encoding if mode is None else f"int8-{mode}"] = (codec.row_bytes, round(codec.ratio, 3))
    assert sizes == {"exact": (188, 1.0), "float16": (94, 2.0), "bfloat16": (94, 2.0), "int8-row": (51, 3.686),
                     "int8-column": (47, 4.0)}
    assert RowCodec.from_manifest(_codec("int8", "column", x).to_manifest()).scales.tobytes() == \
        column_scales(_absmax(x)).tobytes()
    assert make_codec("int8", DIM, np.float16).row_bytes == DIM + 4 and DEFAULT_SCALE_MODE == "row"
    assert set(ENCODINGS) == {e for e, _ in CODECS}


def test_bad_arguments_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="^encoding: unknown 'int4'"):
        make_codec("int4", DIM)
    with pytest.raises(ValueError, match="^dtype: float64 rows cannot be encoded"):
        make_codec("float16", DIM, np.float64)
    with pytest.raises(ValueError, match="^scale_mode: unknown 'block'"):
        make_codec("int8", DIM, scale_mode="block")
    with pytest.raises(ValueError, match="^absmax: int8 'column'"):
        make_codec("int8", DIM, scale_mode="column")
    with pytest.raises(ValueError, match="^absmax: the float16 encoding's error bound scales with the values"):
        make_codec("float16", DIM).bound()
    codec = make_codec("int8", DIM)
    with pytest.raises(ValueError, match=r"^rows: expected float32 rows"):
        codec.encode(np.zeros((2, DIM), np.float64))
    with pytest.raises(ValueError, match=r"^rows: expected shape \[n, 47\]"):
        codec.encode(np.zeros((2, DIM + 1), np.float32))
    with pytest.raises(ValueError, match=r"^encoded rows: expected torch.uint8 \[n, 51\], got torch.uint8 \[2, 47\]"):
        codec.decode_torch(torch.zeros((2, DIM), dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"^encoded rows: expected raw bytes \[n, 94\]"):
        make_codec("float16", DIM).decode_numpy(np.zeros((2, DIM), np.uint8))
    with pytest.raises(InputError, match=r"^store/codec\.json: row codec: missing field 'dim'"):
        RowCodec.from_manifest({"encoding": "int8", "dtype": "float32"}, "store/codec.json")
    with pytest.raises(InputError, match=r"row_bytes is 47, but .* has 51"):
        RowCodec.from_manifest({**codec.to_manifest(), "row_bytes": 47})


def test_no_rows() -> None:
    for encoding, mode in CODECS:
        codec = make_codec(encoding, DIM, scale_mode=mode or DEFAULT_SCALE_MODE, absmax=np.ones(DIM, np.float32))
        enc = codec.encode(np.zeros((0, DIM), np.float32))
        assert codec.decode_numpy(enc).shape == (0, DIM)
        assert tuple(codec.decode_torch(torch.from_numpy(enc)).shape) == (0, DIM)
