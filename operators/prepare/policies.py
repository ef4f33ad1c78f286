"""Tier policies: which rows the GPU and CPU tiers hold, by a built-in name or a user's function.

A policy function receives the round's access counts and returns the rows of a static tier::

    def my_tier(counts: np.ndarray, rows: int, exclude: np.ndarray) -> np.ndarray:
        '''counts: int64 [num_nodes] accesses per node over the round; rows: the most the tier
        holds (from the byte budget); exclude: ids already in a faster tier. Returns node ids.'''

Built-in names: the GPU tier ``"hottest"`` (the most accessed rows, DiskGNN and Ginex alike);
the CPU tier ``"belady"`` (a cache planned per superbatch with Belady's rule, its contents
change between batches: Ginex) or ``"static"`` (the most accessed rows outside the GPU tier,
fixed for the round: DiskGNN). A function makes a static tier, planned like ``"static"``.
A policy is identified in cache keys and manifests by its name, or by the function's
qualified name and a hash of its code, so editing the function re-plans.
"""
from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np

from ...errors import ConfigError, InputError
from .plan import initial_fill, static_tier

__all__ = ["CPU_POLICIES", "GPU_POLICIES", "FilePolicy", "Policy", "TierPolicy", "check_policy",
           "choose_cpu_tier", "choose_gpu_tier", "choose_tier", "choose_tiers", "planned", "policy_id"]

TierPolicy = Callable[[np.ndarray, int, np.ndarray], np.ndarray]
Policy = str | TierPolicy   # a built-in name or a function
GPU_POLICIES = ("hottest",)
CPU_POLICIES = ("belady", "static")


class FilePolicy:
    """A policy function of a user's ``.py`` file, by path and name: what travels to Dask workers.

    A function of a file imported under a made-up module name cannot be pickled by reference
    (a worker cannot import that module), so the pipeline carries this instead; each process
    imports the file once, on first call.
    """

    _loaded: ClassVar[dict[tuple[str, str], Callable[..., np.ndarray]]] = {}   # per process

    def __init__(self, path: str | os.PathLike[str], name: str) -> None:
        self.path, self.name = os.fspath(path), name

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return FilePolicy, (self.path, self.name)

    def __repr__(self) -> str:
        return f"FilePolicy({self.path!r}, {self.name!r})"

    @property
    def function(self) -> Callable[..., np.ndarray]:
        """The function itself (the file imported in this process on first use)."""
        key = (self.path, self.name)
        if key not in FilePolicy._loaded:
            import importlib.util

            digest = hashlib.sha256(self.path.encode()).hexdigest()[:16]
            spec = importlib.util.spec_from_file_location(f"diskflow_user_policy_{digest}", self.path)
            if spec is None or spec.loader is None:
                raise ConfigError("pipeline", f"{self.path}: cannot be imported for its policy {self.name}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            FilePolicy._loaded[key] = getattr(module, self.name)
        return FilePolicy._loaded[key]

    def __call__(self, counts: np.ndarray, rows: int, exclude: np.ndarray) -> np.ndarray:
        return self.function(counts, rows, exclude)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FilePolicy) and (self.path, self.name) == (other.path, other.name)

    def __hash__(self) -> int:
        return hash((self.path, self.name))


def check_policy(policy: object, which: str, option: str | None = None) -> None:
    """Raise `ConfigError` (naming `option`, by default ``{which}_tier``) unless `policy` is a built-in name of
    tier `which` ("gpu"/"cpu") or a callable."""
    names = GPU_POLICIES if which == "gpu" else CPU_POLICIES
    if callable(policy):
        return
    if not isinstance(policy, str) or policy not in names:
        raise ConfigError(option or f"{which}_tier", f"expected one of {', '.join(names)} or a function "
                                                     f"(counts, rows, exclude) -> node ids, got {policy!r}")


def policy_id(policy: Policy) -> str:
    """A stable name for `policy`: the built-in name, or ``module.qualname#hash`` of a function's code."""
    if isinstance(policy, str):
        return policy
    if isinstance(policy, FilePolicy):
        policy = policy.function
    module = str(getattr(policy, "__module__", "?"))
    source = inspect.getsourcefile(policy) if inspect.isfunction(policy) else None
    if source and module.startswith(("diskflow_user_pipeline", "diskflow_user_policy")):   # a user's file, imported under a made-up name
        module = Path(source).stem
    name = f"{module}.{getattr(policy, '__qualname__', type(policy).__name__)}"
    try:
        code = inspect.getsource(policy).encode()
    except (OSError, TypeError):
        code = repr(getattr(policy, "__code__", policy)).encode()
    return f"{name}#{hashlib.sha256(code).hexdigest()[:12]}"


def planned(policy: Policy) -> bool:
    """Whether the CPU tier is planned batch by batch (Belady) rather than fixed for the round."""
    return policy == "belady"


def choose_tier(policy: Policy, counts: np.ndarray, rows: int, exclude: np.ndarray, which: str) -> np.ndarray:
    """The rows of a static tier (int64 node ids, at most `rows`, none in `exclude`), chosen by `policy`.

    A user's function is called with a read-only view of the counts and its answer checked:
    ids in range, distinct, outside `exclude`, at most `rows` of them. Raises `ConfigError`
    naming the policy otherwise.
    """
    if isinstance(policy, str):
        return static_tier(counts, rows, exclude)
    view = np.asarray(counts, dtype=np.int64).view()     # the documented int64, whatever the counts were kept in
    view.flags.writeable = False
    try:
        ids = policy(view, int(rows), np.asarray(exclude, np.int64))
    except Exception as e:
        raise ConfigError(f"{which}_tier", f"the policy {policy_id(policy)} failed: {type(e).__name__}: {e}") from e
    ids = np.asarray(ids)
    fault = None
    if ids.ndim != 1 or not (ids.size == 0 or np.issubdtype(ids.dtype, np.integer)):
        fault = f"returned {ids.dtype} of shape {ids.shape}, not a 1-d array of node ids"
    elif ids.shape[0] > rows:
        fault = f"returned {ids.shape[0]:,} ids for a tier of {rows:,} rows"
    elif ids.size and (ids.min() < 0 or ids.max() >= np.asarray(counts).shape[0]):
        fault = f"returned ids outside 0..{np.asarray(counts).shape[0] - 1}"
    elif np.unique(ids).shape[0] != ids.shape[0]:
        fault = "returned the same id twice"
    elif len(exclude) and np.isin(ids, exclude).any():
        fault = "returned ids of a faster tier (`exclude`)"
    if fault is not None:
        raise ConfigError(f"{which}_tier", f"the policy {policy_id(policy)} {fault}")
    return ids.astype(np.int64, copy=False)


def choose_tiers(gpu_policy: Policy, cpu_policy: Policy, counts: np.ndarray, gpu_rows: int, cpu_rows: int,
                 first_batches: Callable[[], list[np.ndarray]], cpu_slots: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The GPU tier (sorted node ids) and the CPU tier's slots at round start (-1 = empty slot).

    The one place both the offline preparation and the stream turn policies and row budgets into
    tiers. A planned (Belady) CPU tier starts filled with the rows of `first_batches()` (called
    only then: the first superbatches' batches); a static one holds what its policy chose for the
    whole round. Either is laid out in node order, empty slots last (`choose_cpu_tier`).
    `cpu_slots`, when given (a resumed stream: the slots its checkpoint saved), is the CPU tier as
    it stands, checked against `cpu_rows`; no policy runs.
    """
    gpu_ids = choose_gpu_tier(gpu_policy, counts, gpu_rows)
    return gpu_ids, choose_cpu_tier(cpu_policy, counts, cpu_rows, gpu_ids, first_batches, cpu_slots)


def choose_gpu_tier(gpu_policy: Policy, counts: np.ndarray, gpu_rows: int) -> np.ndarray:
    """The GPU tier alone (sorted node ids): `choose_tiers`' first half, all a window's trace needs."""
    return np.sort(choose_tier(gpu_policy, counts, gpu_rows, np.zeros(0, np.int64), "gpu"))


def choose_cpu_tier(cpu_policy: Policy, counts: np.ndarray, cpu_rows: int, gpu_ids: np.ndarray,
                    first_batches: Callable[[], list[np.ndarray]], cpu_slots: np.ndarray | None = None) -> np.ndarray:
    """The CPU tier's slots at round start, given the GPU tier: `choose_tiers`' second half.

    A policy's choice is laid out in node order (ascending ids, then the empty slots): which slot a
    row starts in changes no plan (eviction ranks rows, not slots), and in node order each feature
    shard's rows of the tier's rows file are one contiguous range, written by its pack task in one
    write (`pack._write_targets`). A resumed stream's slots (`cpu_slots`) are kept as they are.
    """
    if cpu_slots is not None:
        slots = np.asarray(cpu_slots, np.int64)
        if slots.shape != (cpu_rows,):
            raise InputError("checkpoint cpu_ids.npy", f"holds {slots.shape[0]} CPU-tier slots, this run's budget "
                                                       f"gives {cpu_rows}; resume with the same options")
        return slots
    if planned(cpu_policy):
        ids = initial_fill(first_batches(), cpu_rows, counts, gpu_ids)
        ids = ids[ids >= 0]
    else:
        ids = np.asarray(choose_tier(cpu_policy, counts, cpu_rows, gpu_ids, "cpu"), np.int64)
    return np.concatenate([np.sort(ids), np.full(cpu_rows - ids.shape[0], -1, np.int64)])
