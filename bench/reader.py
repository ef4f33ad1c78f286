"""`diskflow bench reader`: the native direct-I/O reader's backends next to fio, on one file.

Measures, with O_DIRECT (the page cache bypassed), on the same file in one run:
- sequential read bandwidth with large requests (default 4 MiB) at queue depths 8 and 16;
- random 4 KiB read IOPS at queue depth 64;
- page-merged row reads (`read_rows`): random rows of `--row-bytes`, rows/s and read amplification;
for each backend of `DirectReader` ("uring" when usable, "pread" with one thread per request in
flight), and the same sequential/random patterns with `fio` (ioengine io_uring; psync threads for
random reads) when fio is installed. Every measurement runs `--repeat` times, the configurations
interleaved (a shared machine is noisy), and the table shows medians. The test file is made under `--dir` and removed afterwards
(or `--file` reads an existing file and keeps it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..native.reader import ALIGN, DirectReader, aligned_empty
from ..operators.formats.sizes import format_bytes, parse_bytes
from .common import drop_page_cache, print_table

__all__ = ["RANDOM_BATCH", "ROWS_PER_CALL", "WRITE_CHUNK", "MiB", "add_arguments", "fio", "make_file",
           "random_4k", "random_rows", "run", "sequential"]

MiB = 1 << 20
# Random bytes written per chunk when making the test file (the chunk is repeated).
WRITE_CHUNK = 64 * MiB
# Random reads issued per read() call: big enough that the queue's drain at the end is negligible.
RANDOM_BATCH = 16384
# Rows per read_rows() call in the row benchmark.
ROWS_PER_CALL = 65536


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench reader`."""
    p.add_argument("--dir", default=".", help="directory for the test file, on the disk to measure (default: .)")
    p.add_argument("--file", default=None, help="read this existing file instead (kept)")
    p.add_argument("--size", default="2GiB", help="test file size (default 2GiB)")
    p.add_argument("--seq-block", default="4MiB", help="sequential request size (default 4MiB)")
    p.add_argument("--seq-depths", default="8,16", help="sequential queue depths (default 8,16)")
    p.add_argument("--rand-depth", type=int, default=64, help="random 4 KiB read queue depth (default 64)")
    p.add_argument("--seconds", type=float, default=3.0, help="duration of each random-read run (default 3)")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of every measurement, interleaved; the table shows the median (default 3)")
    p.add_argument("--row-bytes", type=int, default=512, help="row size of the read_rows run, 0 = skip (default 512)")
    p.add_argument("--backends", default="uring,pread", help="reader backends to run (default uring,pread)")
    p.add_argument("--no-fio", action="store_true", help="skip fio even if installed")
    p.add_argument("--seed", type=int, default=0, help="random seed of offsets and file content")


def make_file(directory: str | os.PathLike[str], size: int, seed: int = 0) -> Path:
    """Write a file of `size` random-ish bytes (a random chunk repeated) under `directory`, fsync it
    and evict it from the page cache. The caller removes it."""
    rng = np.random.default_rng(seed)
    chunk = rng.integers(0, 256, min(size, WRITE_CHUNK), dtype=np.uint8).tobytes()
    fd, name = tempfile.mkstemp(prefix=".bench-reader-", suffix=".bin", dir=directory)
    try:
        done = 0
        while done < size:
            done += os.write(fd, chunk[: size - done])
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise
    os.close(fd)
    drop_page_cache(name)
    return Path(name)


def sequential(path: Path, backend: str, depth: int, block: int, size: int) -> dict[str, Any]:
    """Read [0, size) once with requests of `block` bytes, `depth` in flight. Returns bytes/s."""
    n = size // block
    with DirectReader(queue_depth=depth, threads=depth, backend=backend) as r:
        h = r.open(path)
        out = aligned_empty(depth * block)  # requests cycle through `depth` slots (data not kept)
        offsets = np.arange(n, dtype=np.int64) * block
        t0 = time.perf_counter()
        r.read(h, offsets, np.full(n, block), out, (np.arange(n) % depth) * block)
        dt = time.perf_counter() - t0
        c = r.counters()
    return {"bytes": c["bytes_read"], "seconds": dt, "bw": c["bytes_read"] / dt, "requests": c["requests"]}


def random_4k(path: Path, backend: str, depth: int, size: int, seconds: float, seed: int = 0) -> dict[str, Any]:
    """Random aligned 4 KiB reads over [0, size), `depth` in flight, for about `seconds`."""
    rng = np.random.default_rng(seed)
    pages = size // ALIGN
    with DirectReader(queue_depth=depth, threads=depth, backend=backend) as r:
        h = r.open(path)
        out = aligned_empty(depth * ALIGN)
        slots = (np.arange(RANDOM_BATCH) % depth) * ALIGN
        lengths = np.full(RANDOM_BATCH, ALIGN)
        ios = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            r.read(h, rng.integers(0, pages, RANDOM_BATCH) * ALIGN, lengths, out, slots)
            ios += RANDOM_BATCH
        dt = time.perf_counter() - t0
    return {"ios": ios, "seconds": dt, "iops": ios / dt, "bw": ios * ALIGN / dt}


def random_rows(path: Path, backend: str, depth: int, size: int, row_bytes: int, seconds: float,
                seed: int = 0) -> dict[str, Any]:
    """read_rows of random rows (row-aligned offsets) for about `seconds`: rows/s, amplification."""
    rng = np.random.default_rng(seed)
    rows = size // row_bytes
    with DirectReader(queue_depth=depth, threads=depth, backend=backend) as r:
        h = r.open(path)
        out = np.empty((ROWS_PER_CALL, row_bytes), dtype=np.uint8)
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            r.read_rows(h, rng.integers(0, rows, ROWS_PER_CALL) * row_bytes, row_bytes, out)
            n += ROWS_PER_CALL
        dt = time.perf_counter() - t0
        c = r.counters()
    return {"rows": n, "seconds": dt, "rows_per_s": n / dt, "bw": c["bytes_read"] / dt,
            "amplification": c["bytes_read"] / c["bytes_requested"], "requests": c["requests"]}


def fio(path: Path, rw: str, block: int, depth: int, size: int, seconds: float | None,
        engine: str = "io_uring") -> dict[str, Any]:
    """Run fio on `path` (O_DIRECT, read-only); returns its read bandwidth and IOPS.

    With engine "psync", `depth` threads issue blocking reads (fio's equivalent of our pread pool).
    """
    cmd = ["fio", "--name=bench", f"--filename={path}", "--readonly", "--direct=1", f"--rw={rw}",
           f"--bs={block}", f"--size={size}", f"--ioengine={engine}", "--output-format=json"]
    if engine == "psync":
        cmd += [f"--numjobs={depth}", "--thread", "--group_reporting"]
    else:
        cmd += [f"--iodepth={depth}"]
    if seconds is not None:
        cmd += [f"--runtime={max(1, round(seconds * 1000))}ms", "--time_based"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fio failed ({' '.join(cmd)}): {proc.stderr.strip()[-500:]}")
    job = json.loads(proc.stdout[proc.stdout.index("{"):])["jobs"][0]["read"]
    return {"bw": float(job["bw_bytes"]), "iops": float(job["iops"]), "seconds": job["runtime"] / 1000.0}


def _seq_cells(m: dict[str, Any]) -> tuple[float, ...]:
    return (m["bw"] / 1e6, m["requests"] / m["seconds"], 0.0, 0.0)


def _iops_cells(m: dict[str, Any]) -> tuple[float, ...]:
    return (m["bw"] / 1e6, m["iops"], 0.0, 0.0)


def _rows_cells(m: dict[str, Any]) -> tuple[float, ...]:
    return (m["bw"] / 1e6, m["requests"] / m["seconds"], m["rows_per_s"], m["amplification"])


def _depths(text: str) -> list[int]:
    try:
        depths = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError("--seq-depths", f"expected comma-separated integers, got {text!r}") from None
    if not depths or min(depths) < 1:
        raise ConfigError("--seq-depths", f"expected depths >= 1, got {text!r}")
    return depths


def _backends(text: str) -> list[str]:
    """The requested backends that work here (the kernel may refuse io_uring at run time)."""
    usable = []
    for b in [v.strip() for v in text.split(",") if v.strip()]:
        if b not in ("uring", "pread"):
            raise ConfigError("--backends", f"unknown backend {b!r} (use uring, pread)")
        try:
            DirectReader(backend=b).close()
            usable.append(b)
        except (OSError, ValueError) as e:
            print(f"backend {b} skipped: {e}")
    return usable


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure each backend and fio on one file; print the table; return the figures."""
    block = parse_bytes(args.seq_block, "--seq-block")
    if block < ALIGN or block % ALIGN:
        raise ConfigError("--seq-block", f"must be a multiple of {ALIGN}, got {block}")
    depths = _depths(args.seq_depths)
    if args.repeat < 1:
        raise ConfigError("--repeat", f"must be >= 1, got {args.repeat}")
    if args.rand_depth < 1:
        raise ConfigError("--rand-depth", f"must be >= 1, got {args.rand_depth}")
    backends = _backends(args.backends)
    use_fio = not args.no_fio and shutil.which("fio") is not None

    made = args.file is None
    if made:
        size = parse_bytes(args.size, "--size") // block * block
        if size < block:
            raise ConfigError("--size", f"must hold at least one --seq-block ({block} bytes)")
        t0 = time.perf_counter()
        path = make_file(args.dir, size, args.seed)
        print(f"test file {path}: {format_bytes(size)} written in {time.perf_counter() - t0:.1f}s")
    else:
        path = Path(args.file)
        size = path.stat().st_size // block * block
        if size < block:
            raise ConfigError("--file", f"{path} is smaller than one --seq-block")
    figures: dict[str, Any] = {"file_bytes": size, "seq_block": block, "rand_depth": args.rand_depth,
                               "backends": backends, "fio": use_fio, "repeat": args.repeat}
    # Each configuration: (table cells, figure key, measure() -> (MB/s, IOPS, rows/s, amplification)).
    configs: list[tuple[dict[str, Any], str, Any]] = []
    for depth in depths:
        for b in backends:
            configs.append(({"test": "sequential", "reader": b, "depth": depth}, f"seq_bw_{b}_qd{depth}",
                            lambda b=b, d=depth: _seq_cells(sequential(path, b, d, block, size))))
        if use_fio:
            configs.append(({"test": "sequential", "reader": "fio io_uring", "depth": depth},
                            f"seq_bw_fio_qd{depth}",
                            lambda d=depth: _iops_cells(fio(path, "read", block, d, size, None))))
    for b in backends:
        configs.append(({"test": "random 4 KiB", "reader": b, "depth": args.rand_depth}, f"rand4k_iops_{b}",
                        lambda b=b: _iops_cells(random_4k(path, b, args.rand_depth, size, args.seconds, args.seed))))
    if use_fio:
        for engine in ("io_uring", "psync"):
            configs.append(({"test": "random 4 KiB", "reader": f"fio {engine}", "depth": args.rand_depth},
                            f"rand4k_iops_fio_{engine}",
                            lambda e=engine: _iops_cells(fio(path, "randread", ALIGN, args.rand_depth, size,
                                                            args.seconds, e))))
    if args.row_bytes > 0:
        for b in backends:
            configs.append(({"test": f"read_rows {args.row_bytes} B", "reader": b, "depth": args.rand_depth},
                            f"rows_{b}",
                            lambda b=b: _rows_cells(random_rows(path, b, args.rand_depth, size, args.row_bytes,
                                                                args.seconds, args.seed))))
    runs: list[list[tuple[float, ...]]] = [[] for _ in configs]
    try:
        for b in backends:  # warm-up: thread pools, rings, the device's queues
            random_4k(path, b, args.rand_depth, size, min(args.seconds, 0.5), args.seed)
        for _ in range(args.repeat):
            for i, (_, _, measure) in enumerate(configs):
                runs[i].append(measure())
    finally:
        if made:
            path.unlink()
    rows = []
    for (cells, key, _), got in zip(configs, runs):
        med = [float(np.median([g[k] for g in got])) for k in range(4)]
        row = dict(cells, **{"MB/s": med[0], "IOPS": med[1]})
        # The figure of a configuration: bytes/s (sequential), IOPS (random), rows/s (read_rows).
        pick = 2 if key.startswith("rows_") else 1 if key.startswith("rand4k_") else 0
        scale = 1e6 if pick == 0 else 1.0
        if pick == 2:
            row.update({"rows/s": med[2], "amplif.": med[3]})
            figures[key.replace("rows_", "rows_amplification_")] = med[3]
            key = key.replace("rows_", "rows_per_s_")
        figures[key] = med[pick] * scale
        figures[key + "_runs"] = [g[pick] * scale for g in got]
        rows.append(row)
    print_table(f"direct-I/O reads of {path.name} ({format_bytes(size)}, O_DIRECT, {format_bytes(block)} "
                f"sequential requests); medians of {args.repeat} interleaved runs; IOPS = requests/s",
                rows, ["test", "reader", "depth", "MB/s", "IOPS", "rows/s", "amplif."])
    return figures
