"""The CPU budget's check: a budget too small for the trainer's staging and I/O buffers names the smallest
budget that works and the settings that, each alone, would make the given one work, from the same model."""
from __future__ import annotations

import numpy as np
import pytest
from diskflow.operators.prepare.tiers import (
    STAGING_PIECE_BYTES,
    Sampling,
    batch_rows_bound,
    check_staging_piece,
    fitting_settings,
    staging_piece_bytes,
    staging_rows_fit,
    tier_sizes,
)
from diskflow.operators.trainbuffers import staging_buffers

from diskflow.errors import ConfigError


def _need(rows: int, rb: int, buffers: int, shards: int, io: int, piece: int = STAGING_PIECE_BYTES) -> int:
    return buffers * staging_piece_bytes(rows, rb, shards, piece) + io


@pytest.mark.parametrize("capped", [False, True], ids=["default-piece", "capped-piece"])
def test_staging_rows_fit_inverts_the_staging_model(capped: bool) -> None:
    rng = np.random.default_rng(int(capped))
    for _ in range(200 if capped else 300):
        # (capped: some rows wider than the cap, where a buffer holds one row)
        rb = int(rng.integers(4, 256 << 10 if capped else 2048))
        buffers, shards = int(rng.integers(1, 7)), int(rng.integers(1, 9))
        io, budget = int(rng.integers(0, 3 << 20)), int(rng.integers(1 << 16, 200 << 20))
        piece = int(rng.integers(64 << 10, 40 << 20)) if capped else STAGING_PIECE_BYTES
        rows = staging_rows_fit(budget, rb, buffers, shards, io, piece)
        if rows == 1 << 62:         # a whole piece fits: any batch does
            assert _need(1 << 40, rb, buffers, shards, io, piece) <= budget
            continue
        assert rows == 0 or _need(rows, rb, buffers, shards, io, piece) <= budget
        assert _need(rows + 1, rb, buffers, shards, io, piece) > budget


def test_the_settings_named_fit_and_one_more_would_not() -> None:
    rb, shards, io, n, fans = 256, 3, 2 << 20, 200_000, (10, 10, 10)
    sampling = Sampling(1024, fans, n)
    buffers = staging_buffers(2)
    for budget in (5 << 20, 40 << 20, 100 << 20, 125 << 20):
        got = {s.name: s.value for s in fitting_settings(budget, rb, 155_692, buffers, shards, io, "cpu", sampling)}
        limit = staging_rows_fit(budget, rb, buffers, shards, io)
        if "batch_size" in got:
            b = got["batch_size"]
            assert batch_rows_bound(b, fans, n) <= limit < batch_rows_bound(b + 1, fans, n)
        if "fanouts" in got:
            c = max(got["fanouts"])
            assert got["fanouts"] == (c, c, c)
            assert batch_rows_bound(1024, (c,) * 3, n) <= limit < batch_rows_bound(1024, (c + 1,) * 3, n)
        if "queue_depth" in got:
            q = got["queue_depth"]
            assert _need(155_692, rb, staging_buffers(q), shards, io) <= budget
            assert _need(155_692, rb, staging_buffers(q + 1), shards, io) > budget
    assert list(got) == ["queue_depth", "batch_size", "fanouts"]    # 125 MiB: one buffer fewer is enough
    assert got["queue_depth"] == 1
    assert [s.name for s in fitting_settings(5 << 20, rb, 155_692, buffers, shards, io, "cpu", sampling)] == \
        ["batch_size"]
    # nothing smaller fits 2.5 MiB: not even one row a batch at the I/O buffers' 2 MiB
    assert fitting_settings(io + 4096, rb, 155_692, buffers, shards, io, "cpu", sampling) == []


def test_the_refusal_is_one_line_naming_the_budget_and_a_setting() -> None:
    sampling = Sampling(1024, (10, 10, 10), 200_000)
    with pytest.raises(ConfigError) as e:
        tier_sizes(0, 100 << 20, 256, 200_000, "cpu", 155_692, staging_buffers(2), 1, 2 << 20, sampling=sampling)
    text = str(e.value)
    assert "\n" not in text and text.startswith("cpu_memory: 100.00 MiB cannot hold")
    assert "the smallest budget that works is 130.05 MiB" in text
    assert "queue_depth=1 or batch_size=90 (at most 99,990 rows a batch) or fanouts=(4, 4, 4)" in text
    flags = {"queue_depth": "--queue-depth", "batch_size": "--batch-size", "fanouts": "--fanouts"}
    assert "--queue-depth 1 or --batch-size 90 (at most 99,990 rows a batch) or --fanouts 4,4,4 (at most 87,040 " \
           "rows a batch) would fit 100.00 MiB" in e.value.render(lambda o: flags.get(o, o))
    # a command without a flag for one of them names the others
    assert e.value.render(lambda o: {"batch_size": "--batch-size"}.get(o, o)).endswith(
        "; --batch-size 90 (at most 99,990 rows a batch) would fit 100.00 MiB")
    with pytest.raises(ConfigError, match=r"; no smaller batch size, fanouts or queue depth alone would fit"):
        tier_sizes(0, 2 << 20, 256, 200_000, "cpu", 155_692, staging_buffers(2), 1, 2 << 20, sampling=sampling)


def test_a_default_budget_too_small_is_raised_to_what_works() -> None:
    need = _need(155_692, 256, 4, 1, 2 << 20)
    sizes = tier_sizes(0, 5 << 20, 256, 200_000, "cpu", 155_692, 4, 1, 2 << 20, raise_cpu=True)
    assert sizes.cpu_budget == need and sizes.cpu_rows == 0
    assert tier_sizes(0, need + 2560, 256, 200_000, "cpu", 155_692, 4, 1, 2 << 20, raise_cpu=True).cpu_rows == 10


def test_a_staging_piece_cap_shrinks_the_staging_and_the_cpu_tier_gets_the_rest() -> None:
    rb, shards, io, rows = 256, 4, 2 << 20, 150_000       # 36.6 MiB of rows a batch: over either cap
    buffers = staging_buffers(2)
    default = tier_sizes(0, 400 << 20, rb, 10_000_000, "cpu", rows, buffers, shards, io)
    small = tier_sizes(0, 400 << 20, rb, 10_000_000, "cpu", rows, buffers, shards, io, piece=8 << 20)
    assert default.staging_bytes == buffers * staging_piece_bytes(rows, rb, shards) == buffers * ((32 << 20) + 6 * 4096)
    assert small.staging_bytes == buffers * staging_piece_bytes(rows, rb, shards, 8 << 20) == buffers * ((8 << 20) + 6 * 4096)
    assert small.cpu_rows - default.cpu_rows == (default.staging_bytes - small.staging_bytes) // rb
    # a batch smaller than the cap takes its own size, and a cap below one row still holds one row
    assert staging_piece_bytes(100, rb, shards, 8 << 20) == 7 * 4096 + 6 * 4096     # 25,600 bytes in 7 pages
    assert staging_piece_bytes(rows, 1 << 20, shards, 64 << 10) == (1 << 20) + 6 * 4096
    # ... so a buffer with room for a whole cap but not for one such row fits no batch at all
    assert staging_rows_fit(4 * ((100 << 10) + 3 * 4096), 128 << 10, 4, 1, 0, 64 << 10) == 0


@pytest.mark.parametrize("given, expect", [(8 << 20, 8 << 20), ("8MiB", 8 << 20), ("64KiB", 64 << 10),
                                           (np.int64(1 << 20), 1 << 20)])
def test_a_staging_piece_is_a_size_of_at_least_64_kib(given: object, expect: int) -> None:
    assert check_staging_piece(given) == expect


@pytest.mark.parametrize("bad", [(64 << 10) - 1, 0, -1, True, 1.5, "lots", "1KiB", None])
def test_a_bad_staging_piece_is_one_line_naming_the_option(bad: object) -> None:
    with pytest.raises(ConfigError, match="^--staging-piece: ") as e:
        check_staging_piece(bad, "--staging-piece")
    assert "\n" not in str(e.value)
