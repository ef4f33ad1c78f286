"""Feature rows in fewer bytes: a row codec, its encoded layout and the error it promises.

A feature row read from disk, held in a tier or shipped to the GPU costs its bytes everywhere; a codec
that halves or quarters them doubles or quadruples what every budget holds. `RowCodec` describes one
encoding of a store's rows (float32 or float16, ``dim`` wide), vectorised both ways, and says how far a
decoded value may lie from the exact one (`RowCodec.bound`), so a run can state the error it accepted:

    exact      the rows as stored, bit for bit (NaN payloads included)
    float16    IEEE half precision: relative error at most 2**-11, absolute 2**-25 in the subnormal range;
               values of magnitude 65520 or more (which round to infinity) are refused
    bfloat16   the upper 16 bits of the float32, rounded to nearest even: relative error at most 2**-8;
               stored as uint16 bit patterns (numpy has no bfloat16, torch decodes them as its own)
    int8       symmetric absmax quantisation to [-127, 127], error at most half a scale step, in one of
               two scale modes (`SCALE_MODES`):
                 "row"     each row's absmax / 127, a float32 that travels with the row: the encoded row is
                           ``dim`` int8 values, then the scale's 4 bytes (little-endian), ``dim + 4`` bytes
                 "column"  one float32 scale per column, the column's absmax over the whole store / 127
                           (computed beforehand, `operators.prepare.scales`), kept in the codec's manifest

`DEFAULT_SCALE_MODE` is "row": measured on Gaussian features, features with a few large outliers and the
synthetic graphs' features, it had the smaller mean and maximum error in every case, for 4 bytes a row
(a column's absmax over millions of rows is larger than a row's over ``dim`` values, and one outlier
coarsens only its own row, not a whole column). "column" keeps rows at ``dim`` bytes where that matters.

Zero columns (int8 "column") and zero rows (int8 "row") get the scale 0 and decode to exact zeros; no
division by zero happens. The lossy encodings refuse NaN and infinity (`InputError`, naming the row and
column); "exact" keeps whatever the store holds, as the uncompressed path always has.

Decoding is vectorised in numpy (`decode_numpy`) and in torch on whatever device the tensor is on
(`decode_torch`: the loader decodes on the GPU as it assembles a batch); both give the same float32 bits.
Encoded rows are accepted in their typed form (what `encode` returns) or as raw bytes (uint8
[n, row_bytes], as they lie in a file).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InputError

if TYPE_CHECKING:
    import torch

__all__ = ["BFLOAT16_ABS", "BFLOAT16_LIMIT", "BFLOAT16_REL", "DEFAULT_SCALE_MODE", "ENCODINGS", "FLOAT16_ABS",
           "FLOAT16_LIMIT", "FLOAT16_REL", "INT8_ABS", "INT8_MAX", "INT8_SLACK", "ROW_SCALE_BYTES", "SCALE_MODES",
           "STORE_DTYPES", "RowCodec", "column_scales", "encode_bytes", "make_codec",
           "rows_block"]

ENCODINGS = ("exact", "float16", "bfloat16", "int8")
SCALE_MODES = ("row", "column")         # int8: a scale per row (stored with it) or per column (in the manifest)
DEFAULT_SCALE_MODE = "row"              # the smaller error on every feature set measured (module docstring)
STORE_DTYPES = ("float32", "float16")   # what a store's feature rows may be

INT8_MAX = 127                          # symmetric: -128 is never used, so -x encodes as -q
ROW_SCALE_BYTES = 4                     # int8 "row": a float32 scale after the row's values
_SCALE_DTYPE = np.dtype("<f4")          # the scales' bytes, little-endian (as every CUDA device and x86 host)

# The bounds: |decoded - exact| <= max(REL * |exact|, ABS) for the float encodings, scale * (1/2 + SLACK) + ABS
# for int8 (SLACK: float32 rounding of x / scale and q * scale, both under 127 * 2**-24 relative).
FLOAT16_REL = 2.0 ** -11                # half an ulp, relative, of an 11-bit significand
FLOAT16_ABS = 2.0 ** -25                # half the subnormal spacing 2**-24
FLOAT16_LIMIT = 65520.0                 # the smallest magnitude float16 rounds to infinity (max is 65504)
BFLOAT16_REL = 2.0 ** -8                # half an ulp, relative, of an 8-bit significand
BFLOAT16_ABS = 2.0 ** -134              # half bfloat16's spacing among float32 subnormals (2**-133)
BFLOAT16_LIMIT = float((2.0 - 2.0 ** -8) * 2.0 ** 127)   # halfway past bfloat16's max: rounds to infinity
INT8_SLACK = 2.0 ** -14
INT8_ABS = 2.0 ** -149                  # float32's smallest subnormal: q * scale rounded among subnormals


def column_scales(absmax: np.ndarray) -> np.ndarray:
    """int8 "column" scales from the columns' absolute maxima: float32 ``absmax / 127`` rounded up, so that no
    value of a column lies beyond 127 steps (0 for a zero column, which then decodes to exact zeros).

    Raises:
        ValueError: a maximum that is negative, NaN or infinite.
    """
    a = np.asarray(absmax, dtype=np.float32)
    if a.ndim != 1 or not (np.isfinite(a).all() and (a >= 0).all()):
        raise ValueError(f"int8 scales: column maxima must be a 1-D array of finite values >= 0, got {a!r:.200}")
    return _step(a)


def _step(absmax: np.ndarray) -> np.ndarray:
    """The smallest float32 ``s`` with ``127 * s >= absmax`` (float32 ``absmax / 127``, moved up one ulp where
    it rounded down): the quotient of a value by its scale never passes 127, subnormal scales included."""
    a = absmax.astype(np.float32, copy=False)
    s = a / np.float32(INT8_MAX)
    low = s.astype(np.float64) * INT8_MAX < a          # exact in float64
    if low.any():
        s[low] = np.nextafter(s[low], np.float32(np.inf))
    return s


@dataclass(frozen=True, eq=False)
class RowCodec:
    """One encoding of a store's feature rows (see the module docstring).

    Attributes:
        encoding: one of `ENCODINGS`.
        dtype: the store's row dtype (float32 or float16): what `encode` takes and "exact" keeps.
        dim: values per row.
        scale_mode: int8 only (`SCALE_MODES`; None elsewhere).
        scales: int8 "column" only: float32 [dim], the scale of each column (`column_scales`); None elsewhere.
    """

    encoding: str
    dtype: np.dtype
    dim: int
    scale_mode: str | None = None
    scales: np.ndarray | None = None
    _on_device: dict[str, Any] = field(default_factory=dict, init=False, repr=False)   # torch scales by device

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding: unknown {self.encoding!r}; expected one of {ENCODINGS}")
        dtype = np.dtype(self.dtype)
        if dtype.name not in STORE_DTYPES:
            raise ValueError(f"dtype: {dtype.name} rows cannot be encoded; expected one of {STORE_DTYPES}")
        object.__setattr__(self, "dtype", dtype)
        if int(self.dim) < 1:
            raise ValueError(f"dim: must be at least 1, got {self.dim}")
        object.__setattr__(self, "dim", int(self.dim))
        if self.encoding != "int8":
            if self.scale_mode is not None or self.scales is not None:
                raise ValueError(f"scale_mode, scales: only int8 has scales, not {self.encoding}")
            return
        if self.scale_mode not in SCALE_MODES:
            raise ValueError(f"scale_mode: unknown {self.scale_mode!r}; expected one of {SCALE_MODES}")
        if self.scale_mode == "row":
            if self.scales is not None:
                raise ValueError("scales: int8 'row' keeps each row's scale with the row, not in the codec")
            return
        if self.scales is None:
            raise ValueError("scales: int8 'column' needs a scale per column (`column_scales` of their absmax)")
        s = np.array(self.scales, dtype=np.float32)
        if s.shape != (self.dim,) or not (np.isfinite(s).all() and (s >= 0).all()):
            raise ValueError(f"scales: expected {self.dim} finite float32 values >= 0, got shape {list(s.shape)}")
        s.setflags(write=False)
        object.__setattr__(self, "scales", s)

    # ------------------------------------------------------------------ identity

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RowCodec):
            return NotImplemented
        same = (self.encoding, self.dtype, self.dim, self.scale_mode) == \
            (other.encoding, other.dtype, other.dim, other.scale_mode)
        if self.scales is None or other.scales is None:
            return same and self.scales is other.scales
        return same and self.scales.tobytes() == other.scales.tobytes()


    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (for Dask) without the scales cached on devices."""
        return (RowCodec, (self.encoding, self.dtype, self.dim, self.scale_mode, self.scales))

    def __repr__(self) -> str:
        mode = "" if self.scale_mode is None else f", scale_mode={self.scale_mode!r}"
        return f"RowCodec({self.encoding!r}, dtype={self.dtype.name}, dim={self.dim}{mode}, row_bytes={self.row_bytes})"

    # ------------------------------------------------------------------ sizes

    @property
    def encoded_dtype(self) -> np.dtype:
        """The element type of `encode`'s output: the store's for "exact", float16, uint16 (bfloat16 bits),
        int8 (int8 "column") or uint8 (int8 "row": values and scale bytes)."""
        if self.encoding == "exact":
            return self.dtype
        if self.encoding == "int8":
            return np.dtype(np.uint8 if self.scale_mode == "row" else np.int8)
        return np.dtype(np.float16 if self.encoding == "float16" else np.uint16)

    @property
    def row_bytes(self) -> int:
        """Bytes of one encoded row, a per-row scale included."""
        extra = ROW_SCALE_BYTES if self.scale_mode == "row" else 0
        width = 1 if self.encoding == "int8" else self.encoded_dtype.itemsize
        return self.dim * width + extra

    @property
    def exact_row_bytes(self) -> int:
        """Bytes of one row as the store holds it."""
        return self.dim * self.dtype.itemsize

    @property
    def ratio(self) -> float:
        """The compression ratio against exact: exact row bytes / encoded row bytes (2.0: half the bytes)."""
        return self.exact_row_bytes / self.row_bytes

    # ------------------------------------------------------------------ manifest

    def to_manifest(self) -> dict[str, Any]:
        """A JSON-able description (int8 "column" scales inline: `dim` floats, each float32 exactly)."""
        out: dict[str, Any] = {"encoding": self.encoding, "dtype": self.dtype.name, "dim": self.dim,
                               "row_bytes": self.row_bytes}
        if self.scale_mode is not None:
            out["scale_mode"] = self.scale_mode
        if self.scales is not None:
            out["scales"] = [float(v) for v in self.scales]
        return out

    @classmethod
    def from_manifest(cls, entry: dict[str, Any], where: str = "row codec") -> RowCodec:
        """The codec `to_manifest` described; `where` (the manifest's file) names it in an error.

        Raises:
            InputError: a missing or bad field, or a ``row_bytes`` the fields do not give.
        """
        try:
            scales = entry.get("scales")
            codec = cls(entry["encoding"], np.dtype(entry["dtype"]), int(entry["dim"]), entry.get("scale_mode"),
                        None if scales is None else np.asarray(scales, dtype=np.float64).astype(np.float32))
        except KeyError as e:
            raise InputError(where, f"row codec: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise InputError(where, f"row codec: {e}") from None
        if "row_bytes" in entry and int(entry["row_bytes"]) != codec.row_bytes:
            raise InputError(where, f"row codec: row_bytes is {entry['row_bytes']}, but {codec!r} has {codec.row_bytes}")
        return codec

    # ------------------------------------------------------------------ encode

    def encode(self, rows: np.ndarray, where: str = "rows", first_row: int = 0) -> np.ndarray:
        """Encode rows [n, dim] of the store's dtype: [n, dim] of `encoded_dtype` ([n, dim + 4] uint8 for int8
        "row"); "exact" returns `rows` itself.

        Args:
            rows: the rows, of `dtype`.
            where: what the rows are (a shard file), named in an error.
            first_row: the first row's number, for an error to name the row as the caller counts.

        Raises:
            InputError: (lossy encodings) a NaN or infinite value, a value float16 or bfloat16 rounds to
                infinity, or (int8 "column") a value beyond its column's scale; the first such value is named.
            ValueError: rows of another shape or dtype.
        """
        x = self._check_rows(rows)
        if self.encoding == "exact":
            return x
        x = x.astype(np.float32, copy=False)
        if self.encoding == "float16":
            self._refuse(x, FLOAT16_LIMIT, where, first_row)
            return x.astype(np.float16)
        if self.encoding == "bfloat16":
            self._refuse(x, BFLOAT16_LIMIT, where, first_row)
            bits = x.view(np.uint32)
            rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))   # to nearest even
            return (rounded >> np.uint32(16)).astype(np.uint16)
        if self.scale_mode == "column":
            assert self.scales is not None
            self._refuse(x, np.inf, where, first_row)
            return self._quantise(x, self.scales[None, :], where, first_row)
        n = x.shape[0]
        peak = np.abs(x).max(axis=1, initial=0.0)          # NaN and infinity pass through to the row's peak
        if not np.isfinite(peak).all():
            self._refuse(x, np.inf, where, first_row)
        scale = _step(peak).astype(_SCALE_DTYPE, copy=False)
        out = np.empty((n, self.row_bytes), dtype=np.uint8)
        out[:, :self.dim] = self._quantise(x, scale[:, None], where, first_row).view(np.uint8)
        out[:, self.dim:] = scale.view(np.uint8).reshape(n, ROW_SCALE_BYTES)
        return out

    def _check_rows(self, rows: np.ndarray) -> np.ndarray:
        x = np.asarray(rows)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"rows: expected shape [n, {self.dim}], got {list(x.shape)}")
        if x.dtype != self.dtype:
            raise ValueError(f"rows: expected {self.dtype.name} rows (the codec's dtype), got {x.dtype}")
        return x

    def _refuse(self, x: np.ndarray, limit: float, where: str, first_row: int) -> None:
        """Raise for the first value that is NaN, infinite, or of magnitude `limit` or more (one reduction when
        there is none)."""
        if x.size == 0:
            return
        peak = np.abs(x).max()
        if peak < limit:            # False for NaN
            return
        r, c = (int(i) for i in np.argwhere(~(np.abs(x) < limit))[0])
        v = float(x[r, c])
        fault = "non-finite value" if not np.isfinite(v) else f"value beyond {self.encoding}'s range"
        raise InputError(where, f"{fault} {v!r} at row {first_row + r}, column {c}; the {self._name} "
                                f"encoding cannot hold it")

    @property
    def _name(self) -> str:
        return self.encoding if self.scale_mode is None else f"int8 ({self.scale_mode} scales)"

    def _quantise(self, x: np.ndarray, scale: np.ndarray, where: str, first_row: int) -> np.ndarray:
        """round(x / scale) in [-127, 127] as int8 (0 where the scale is 0). A "column" scale was computed from
        other rows: a value more than half a step beyond its range is refused, not clipped."""
        y = np.zeros(np.broadcast_shapes(x.shape, scale.shape), dtype=np.float32)
        np.divide(x, scale, out=y, where=scale > 0)
        if self.scale_mode == "column" and y.size:
            zero = ~(scale[0] > 0)
            if float(y.max()) > INT8_MAX + 0.5 or float(y.min()) < -INT8_MAX - 0.5 or \
                    (zero.any() and bool((x[:, zero] != 0).any())):
                over = (np.abs(y) > INT8_MAX + 0.5) | ((scale <= 0) & (x != 0))
                r, c = (int(i) for i in np.argwhere(over)[0])
                step = float(scale[0, c])
                raise InputError(where, f"value {float(x[r, c])!r} at row {first_row + r}, column {c} is beyond its "
                                        f"column's int8 range (a step of {step!r}, so at most {step * INT8_MAX!r}): "
                                        f"the scales were computed from other rows")
        np.rint(y, out=y)
        np.clip(y, -INT8_MAX, INT8_MAX, out=y)
        return y.astype(np.int8)

    # ------------------------------------------------------------------ decode

    def decode_numpy(self, enc: np.ndarray) -> np.ndarray:
        """Decoded rows, float32 [n, dim], from `encode`'s output or its raw bytes (uint8 [n, row_bytes]).
        "exact" float32 rows are returned as they are (no copy)."""
        a = self._typed_numpy(enc)
        if self.encoding in ("exact", "float16"):
            return a.astype(np.float32, copy=False)
        if self.encoding == "bfloat16":
            return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
        if self.scale_mode == "column":
            assert self.scales is not None
            return a.astype(np.float32) * self.scales
        q = a[:, :self.dim].view(np.int8)
        scale = np.ascontiguousarray(a[:, self.dim:]).view(_SCALE_DTYPE).astype(np.float32, copy=False)
        return q.astype(np.float32) * scale

    def _typed_numpy(self, enc: np.ndarray) -> np.ndarray:
        a = np.asarray(enc)
        want = self.encoded_dtype
        if a.dtype == np.uint8 and want != np.uint8:
            if a.ndim != 2 or a.shape[1] != self.row_bytes:
                raise ValueError(f"encoded rows: expected raw bytes [n, {self.row_bytes}], got {list(a.shape)}")
            a = np.ascontiguousarray(a).view(want)
        width = self.row_bytes if want == np.uint8 else self.dim
        if a.dtype != want or a.ndim != 2 or a.shape[1] != width:
            raw = "" if want == np.uint8 else f" (or raw bytes, uint8 [n, {self.row_bytes}])"
            raise ValueError(f"encoded rows: expected {want.name} [n, {width}]{raw}, got {a.dtype} {list(a.shape)}")
        return a

    def decode_torch(self, enc: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Decoded rows, float32 [n, dim], on `enc`'s device (the same values as `decode_numpy`), from the
        encoded rows as a tensor: typed (bfloat16 bits as uint16 or int16) or raw bytes (uint8
        [n, row_bytes]). "exact" float32 rows are returned as they are. `out`: a float32 [n, dim] tensor on
        the same device to decode into (a reused one: on the CPU a fresh batch-sized tensor costs ten times
        the decoding, its pages zeroed as they are first touched); the same bits either way."""
        import torch

        t = self._typed_torch(enc)
        if out is not None:
            return self._decode_into(t, out)
        if self.encoding in ("exact", "float16"):
            return t.to(torch.float32)
        if self.encoding == "bfloat16":
            return t.view(torch.bfloat16).to(torch.float32)
        if self.scale_mode == "column":
            return t.to(torch.float32) * self._scales_on(t.device)
        if t.shape[0] == 0:         # an empty slice's strides may not allow the view below
            return torch.zeros((0, self.dim), dtype=torch.float32, device=t.device)
        q = t[:, :self.dim].view(torch.int8).to(torch.float32)
        return q * t[:, self.dim:].contiguous().view(torch.float32)

    def _decode_into(self, t: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`decode_torch` of the typed rows `t` into `out` (the same operations, in place)."""
        import torch

        if out.dtype != torch.float32 or tuple(out.shape) != (t.shape[0], self.dim) or out.device != t.device:
            raise ValueError(f"out: expected float32 [{t.shape[0]}, {self.dim}] on {t.device}, got {out.dtype} "
                             f"{list(out.shape)} on {out.device}")
        if self.encoding in ("exact", "float16"):
            return out.copy_(t)
        if self.encoding == "bfloat16":
            return out.copy_(t.view(torch.bfloat16))
        if self.scale_mode == "column":
            return out.copy_(t).mul_(self._scales_on(t.device))
        if t.shape[0] == 0:
            return out
        return out.copy_(t[:, :self.dim].view(torch.int8)).mul_(t[:, self.dim:].contiguous().view(torch.float32))

    def _typed_torch(self, enc: torch.Tensor) -> torch.Tensor:
        import torch

        kinds = {"float32": (torch.float32,), "float16": (torch.float16,), "uint16": (torch.uint16, torch.int16),
                 "int8": (torch.int8,), "uint8": (torch.uint8,)}[self.encoded_dtype.name]
        t = enc
        if t.dtype == torch.uint8 and kinds[0] != torch.uint8:
            if t.dim() != 2 or t.shape[1] != self.row_bytes:
                raise ValueError(f"encoded rows: expected raw bytes [n, {self.row_bytes}], got {list(t.shape)}")
            t = t.contiguous().view(kinds[0])
        width = self.row_bytes if kinds[0] == torch.uint8 else self.dim
        if t.dtype not in kinds or t.dim() != 2 or t.shape[1] != width:
            raw = "" if kinds[0] == torch.uint8 else f" (or raw bytes, torch.uint8 [n, {self.row_bytes}])"
            raise ValueError(f"encoded rows: expected {kinds[0]} [n, {width}]{raw}, got {t.dtype} {list(t.shape)}")
        return t

    def _scales_on(self, device: torch.device) -> torch.Tensor:
        """The column scales as a tensor on `device`, copied there once."""
        import torch

        key = str(device)
        s = self._on_device.get(key)
        if s is None:
            s = torch.as_tensor(np.array(self.scales), device=device)
            self._on_device[key] = s
        return s

    # ------------------------------------------------------------------ error bounds

    def bound(self, absmax: np.ndarray | None = None) -> np.ndarray:
        """The per-column absolute error bound, float64 [dim]: no decoded value of column j lies further than
        ``bound[j]`` from the exact one.

        Args:
            absmax: [dim] the columns' absolute maxima (`operators.prepare.scales`), needed where the error
                scales with the values (float16, bfloat16, int8 "row"); exact and int8 "column" ignore it.

        exact: 0. float16: ``max(2**-11 * absmax, 2**-25)``. bfloat16: ``max(2**-8 * absmax, 2**-134)``.
        int8 "column": ``scale / 2`` (plus float32 rounding: `INT8_SLACK` of a scale, and `INT8_ABS`).
        int8 "row": half the largest row scale ``max(absmax) / 127`` could be, in every column.
        """
        if self.encoding == "exact":
            return np.zeros(self.dim)
        if self.scale_mode == "column":
            assert self.scales is not None
            return self.scales.astype(np.float64) * (0.5 + INT8_SLACK) + INT8_ABS
        if absmax is None:
            raise ValueError(f"absmax: the {self._name} encoding's error bound scales with the values; "
                             f"give the columns' absolute maxima")
        a = np.asarray(absmax, dtype=np.float64)
        if a.shape != (self.dim,):
            raise ValueError(f"absmax: expected shape [{self.dim}], got {list(a.shape)}")
        if self.encoding == "float16":
            return np.maximum(a * FLOAT16_REL, FLOAT16_ABS)
        if self.encoding == "bfloat16":
            return np.maximum(a * BFLOAT16_REL, BFLOAT16_ABS)
        top = float(_step(np.array([a.max()], dtype=np.float32))[0])     # no row's scale is larger
        return np.full(self.dim, top * (0.5 + INT8_SLACK) + INT8_ABS)

    def value_bound(self, rows: np.ndarray) -> np.ndarray:
        """The error bound of every value of `rows` (the exact rows), float64 [n, dim]: tighter than `bound`,
        for the float encodings (relative to each value) and int8 "row" (half each row's own scale)."""
        x = self._check_rows(rows).astype(np.float64)
        n = x.shape[0]
        if self.encoding == "float16":
            return np.maximum(np.abs(x) * FLOAT16_REL, FLOAT16_ABS)
        if self.encoding == "bfloat16":
            return np.maximum(np.abs(x) * BFLOAT16_REL, BFLOAT16_ABS)
        if self.scale_mode == "row":
            scale = _step(np.abs(x.astype(np.float32)).max(axis=1, initial=0.0))
            return np.broadcast_to((scale.astype(np.float64) * (0.5 + INT8_SLACK) + INT8_ABS)[:, None], (n, self.dim))
        return np.broadcast_to(self.bound(), (n, self.dim))


def rows_block(codec: RowCodec) -> dict[str, Any]:
    """What a report says of an encoding: its name, a row's bytes against the store's, and their ratio."""
    return {"encoding": codec.encoding, "row_bytes": codec.row_bytes, "exact_row_bytes": codec.exact_row_bytes,
            "ratio": codec.ratio}


def encode_bytes(codec: RowCodec, rows: np.ndarray, where: str = "rows", first_row: int = 0) -> np.ndarray:
    """`codec.encode(rows)` as raw bytes, uint8 [n, codec.row_bytes]: how packed datasets hold encoded rows (every
    copy, gather and read of the loader moves bytes; `RowCodec.decode_torch` takes them as they are)."""
    enc = np.ascontiguousarray(codec.encode(rows, where, first_row))
    return enc.view(np.uint8).reshape(enc.shape[0], codec.row_bytes)


def make_codec(encoding: str, dim: int, dtype: Any = np.float32, *, scale_mode: str = DEFAULT_SCALE_MODE,
               absmax: np.ndarray | None = None) -> RowCodec:
    """The codec for `encoding` of rows [*, dim] of `dtype`.

    Args:
        encoding: one of `ENCODINGS`.
        dim: values per row.
        dtype: the store's feature dtype (float32 or float16).
        scale_mode: int8's scale mode (`SCALE_MODES`); ignored by the other encodings.
        absmax: int8 "column": the columns' absolute maxima over every row to encode
            (`flow.scales.int8_scales` gives the scales of a store); ignored otherwise.

    Raises:
        ValueError: an unknown encoding, dtype or scale mode, or int8 "column" without `absmax`.
    """
    if encoding != "int8":
        return RowCodec(encoding, np.dtype(dtype), dim)
    if scale_mode == "column":
        if absmax is None:
            raise ValueError("absmax: int8 'column' scales need the columns' absolute maxima over every row")
        return RowCodec(encoding, np.dtype(dtype), dim, scale_mode, column_scales(absmax))
    return RowCodec(encoding, np.dtype(dtype), dim, scale_mode)
