"""The fast crc32 gives zlib's values: for any length, offset, running value and buffer kind."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from diskflow.operators.formats import checksum


def test_the_fast_backend_is_in_use() -> None:
    """On x86 CPUs with carry-less multiplication (every one this project runs on) the checksum folds;
    a table would be about 10x slower."""
    assert checksum.BACKEND == "folded"


def test_buffer_kinds_and_errors() -> None:
    data = np.arange(300, dtype=np.uint16)
    expected = zlib.crc32(data.tobytes())
    assert checksum.crc32(data) == checksum.crc32(data.data) == checksum.crc32(data.tobytes()) == expected
    assert checksum.crc32(bytearray(data.tobytes()), 5) == zlib.crc32(data.tobytes(), 5)
    with pytest.raises(ValueError, match="contiguous"):
        checksum.crc32(data[::2].data)


@pytest.mark.parametrize("n", [0, 1, 3, 15, 16, 17, 63, 64, 65, 255, 4096, 4097, 1 << 20, (1 << 20) + 13])
def test_same_values_as_zlib(n: int) -> None:
    rng = np.random.default_rng(n)
    data = rng.integers(0, 256, n + 7, dtype=np.uint8)
    for offset in (0, 1, 7):
        view = data[offset:offset + n]
        for start in (0, 1, 0xFFFFFFFF, int(rng.integers(0, 1 << 32))):
            assert checksum.crc32(view.data, start) == zlib.crc32(view.data, start)
    assert checksum.crc32(data.tobytes()) == zlib.crc32(data.tobytes())


def test_running_crc_over_chunks() -> None:
    data = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)
    crc = 0
    for start in range(0, data.size, 1 << 18):
        crc = checksum.crc32(data[start:start + (1 << 18)].data, crc)
    assert crc == zlib.crc32(data.data)
