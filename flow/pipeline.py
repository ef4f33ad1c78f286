"""`diskflow.Pipeline`: a pipeline stated as one declarative object, and finding one by name or file.

A pipeline says how a round's data reaches the trainer, not how to train: how batches are
drawn, the sampler and its fanouts, which rows the GPU and CPU tiers hold (a built-in policy
name or the user's own function over access counts), whether misses are packed into
per-batch segments, whether a segmented disk cache may stand in when disk is short, and the
loader that feeds the one training session. The built-in pipelines (``diskflow.pipelines``)
are instances, a few lines each; a user's ``.py`` file defines one the same way::

    import numpy as np
    import diskflow

    def warm_half(counts, rows, exclude):          # the CPU tier: every other of the hottest rows
        hot = np.argsort(-counts, kind="stable")
        return hot[~np.isin(hot, exclude)][: 2 * rows : 2]

    pipeline = diskflow.Pipeline("warm-half", cpu_tier=warm_half)

and ``diskflow prepare my.py``, ``diskflow run my.py`` and ``diskflow bench compare
--pipelines belady,my.py`` take it. `load_pipeline` finds a pipeline by built-in name or
path; a path whose file name matches a built-in pipeline and that is not a file of its own
loads the built-in one.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import ConfigError
from ..operators.formats.rowcodec import ENCODINGS
from ..operators.formats.userfile import import_user_file
from ..operators.options import FANOUTS
from ..operators.prepare.history import check_prune, check_rule
from ..operators.prepare.policies import FilePolicy, Policy, check_policy, policy_id
from ..operators.prepare.sample import check_fanouts
from ..operators.prepare.seeds import BATCH_ORDERS
from ..operators.prepare.task import TASKS
from ..operators.prepare.typedsample import EdgeFanouts, as_fanouts, fanouts_json
from ..operators.train.config import ONLINE_TIERS
from .options import HISTORY_RULE, pipeline_history

__all__ = ["BATCHES", "LOADERS", "ONLINE_TIERS", "PACKAGE", "SAMPLERS", "USER_MODULE", "Pipeline", "Runtime",
           "available_pipelines", "load_pipeline", "pipeline_names", "pipeline_of"]

PACKAGE = "diskflow.pipelines"
USER_MODULE = "diskflow_user_pipeline"     # the module names users' files are imported under
BATCHES = BATCH_ORDERS        # "shuffled": a fresh permutation per epoch; "partition": groups of min-cut parts
SAMPLERS = ("neighbor",)      # uniform neighbour sampling per hop (PyG NeighborLoader's), native

Runtime = Callable[..., dict[str, Any]]     # trains with a loader: ``(pipeline, store, run_dir, **options)`` for the
                                            # packed and online loaders, ``(store, run_dir, **options)`` for the others


# The runtimes behind the loaders (`flow.runtimes`), each imported only when a run starts: they import torch,
# which `import diskflow.flow.pipeline` (the command line's parser, `diskflow prepare`) must not.

def _packed() -> Runtime:
    from .runtimes.packed import run_packed
    return run_packed


def _memory() -> Runtime:
    from .runtimes.memory import run
    return run


def _mmap() -> Runtime:
    from .runtimes.mmap import run
    return run


def _stream() -> Runtime:
    from .runtimes.stream import run
    return run


def _online() -> Runtime:
    from .runtimes.online import run_online
    return run_online


# loader -> a function that imports and returns the runtime that trains with it
LOADERS: dict[str, Callable[[], Runtime]] = {"packed": _packed, "memory": _memory, "mmap": _mmap, "stream": _stream,
                                             "online": _online}


@dataclass(frozen=True)
class Pipeline:
    """How a round's features reach the trainer: the one way a pipeline is stated.

    Attributes:
        name: the pipeline's name (reports, run directories, the packed dataset's manifest).
        loader: what feeds the training session: ``"packed"`` (prepare a packed dataset, then
            the pipelined direct-I/O trainer), ``"memory"`` (every feature in RAM),
            ``"mmap"`` (features through memory maps and the page cache), ``"stream"``
            (prepared on CPU workers superbatch by superbatch, trained on the GPU worker) or
            ``"online"`` (no preparation: sampled on the fly, rows extracted by asynchronous
            direct-I/O readers into a fixed host feature buffer; `operators.train.online`).
        batches: how seeds are cut into batches: ``"shuffled"`` (a seeded permutation per epoch) or
            ``"partition"`` (OUTRE: seeds of a few min-cut parts together, which share more of
            their neighbourhoods; `operators.prepare.seeds.BatchOrder`). A run's ``batches=``
            overrides it.
        sampler: ``"neighbor"``: uniform sampling of `fanouts` neighbours per hop.
        fanouts: the default fanouts (a run's ``fanouts=`` overrides them); -1 = all neighbours.
        gpu_tier: ``"hottest"`` or a function ``(counts, rows, exclude) -> node ids``.
        cpu_tier: ``"belady"`` (planned per superbatch), ``"static"`` (hottest outside the GPU
            tier) or such a function (a static tier); with the online loader, how its feature
            buffer evicts: ``"lru"`` (GNNDrive) or ``"hybrid"`` (LSM-GNN: a lookahead window's
            next uses, then in-degree).
        packing: pack every miss into page-aligned per-batch segments; False: read misses row
            by row from the store (Ginex).
        disk_cache: when packing exceeds the disk budget, keep a MinHash-ordered segmented disk
            cache instead (DiskGNN); False: such a budget is an error.
        history_memory: bytes (or a share of the features, ``"5%"``) of a historical embedding
            cache (OUTRE: cached inputs of the last layer stand in for the subtrees of the most
            connected nodes; `operators.prepare.history`); None: none. The packed loader plans it
            offline into the samples, the memory and mmap loaders online; not the stream loader.
            ``"auto"`` (packed loader): the share of the CPU budget that reads the fewest bytes
            from disk, the rest to the feature cache (OUTRE's memory split, `flow.memsplit`).
        history_staleness: batches a cached embedding stays usable (1: never reused).
        history_prune: what a fresh cached embedding prunes below its node: ``"thin"`` (the default:
            as ``"last-hop"``, but each node left unexpanded at the last hop draws one neighbour there,
            so the straight-through gradient sees its rows computed from a neighbour),
            ``"last-hop"`` (the last hop of its subtree: the lower layers stay exact) or
            ``"subtree"`` (all of it, OUTRE's rule: fewer rows, and the seeds' lower layers see that
            node's features alone).
        history_ramp: the adaptive staleness bound's slope r: an embedding computed at batch t
            stands in for at most max(1, r * t) batches (the early, fast-changing model's expire
            first); 0: the fixed bound.
        history_cooldown: the share of the round's last batches that prune nothing, so training
            ends on exact embeddings (0: none). Both buy accuracy with bytes.
        task: ``"node"`` (classify the training nodes) or ``"link"`` (score the store's training edges
            against negative pairs drawn with the round, the way PyG's ``LinkNeighborLoader`` batches
            them; `operators.prepare.task`). A run's ``task=`` overrides it.
        rows: how feature rows are held out of the model: ``"exact"`` (the store's rows, bit for bit), or
            encoded in fewer bytes (``"float16"``, ``"bfloat16"``, ``"int8"``; `operators.formats.rowcodec`)
            in the tiers and the packed segments, decoded as each batch is assembled. A packing
            pipeline's; a run's ``rows=`` overrides it.
        description: one line for listings.
    """

    name: str
    loader: str = "packed"
    batches: str = "shuffled"
    sampler: str = "neighbor"
    fanouts: tuple[int, ...] = FANOUTS
    gpu_tier: Policy = "hottest"
    cpu_tier: Policy = "belady"
    packing: bool = True
    disk_cache: bool = True
    history_memory: int | str | None = None
    history_staleness: int = HISTORY_RULE["history_staleness"]     # the library's rule (`flow.options`)
    history_prune: str = HISTORY_RULE["history_prune"]
    history_ramp: float = HISTORY_RULE["history_ramp"]
    history_cooldown: float = HISTORY_RULE["history_cooldown"]
    task: str = "node"
    rows: str = "exact"
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "/\\ "):
            raise ConfigError("Pipeline.name", f"expected a short name without spaces or slashes, got {self.name!r}")
        for what, value, allowed in (("loader", self.loader, tuple(LOADERS)), ("batches", self.batches, BATCHES),
                                     ("sampler", self.sampler, SAMPLERS), ("task", self.task, TASKS),
                                     ("rows", self.rows, ENCODINGS)):
            if value not in allowed:
                raise ConfigError(f"Pipeline.{what}", f"expected one of {', '.join(allowed)}, got {value!r}")
        if isinstance(self.fanouts, (str, bytes)) or not hasattr(self.fanouts, "__iter__"):
            raise ConfigError("fanouts", f"expected a sequence of integers >= -1, got {self.fanouts!r}")
        object.__setattr__(self, "fanouts", as_fanouts(self.fanouts) if isinstance(self.fanouts, (dict, EdgeFanouts))
                           else tuple(check_fanouts(self.fanouts)))    # the sampler's own check
        check_policy(self.gpu_tier, "gpu")
        if self.loader == "online":
            if self.cpu_tier == "belady":      # the field's default: the online loader's own default
                object.__setattr__(self, "cpu_tier", "lru")
            if self.cpu_tier not in ONLINE_TIERS:
                raise ConfigError("Pipeline.cpu_tier", f"the online loader's buffer evicts by one of "
                                                       f"{', '.join(ONLINE_TIERS)}, got {self.cpu_tier!r}")
        else:
            check_policy(self.cpu_tier, "cpu")
        if not self.packing and self.disk_cache:
            object.__setattr__(self, "disk_cache", False)     # nothing packed: no disk cache either
        if self.history_memory == "auto" and self.loader != "packed":
            raise ConfigError("Pipeline.history_memory", "auto splits the CPU budget between the feature cache and the "
                                                         f"embedding cache: a packed loader's; the {self.loader} loader "
                                                         "takes a size")
        if isinstance(self.history_staleness, bool) or not isinstance(self.history_staleness, int) \
                or self.history_staleness < 1:
            raise ConfigError("Pipeline.history_staleness", f"expected an integer >= 1, got {self.history_staleness!r}")
        check_prune(self.history_prune, "Pipeline.history_prune")
        check_rule(self.history_ramp, self.history_cooldown, "Pipeline.")
        if self.loader == "online" and self.history_memory not in (None, 0, "0"):
            raise ConfigError("Pipeline.history_memory", "the online loader has no historical embedding cache")
        if self.rows != "exact" and (self.loader not in ("packed", "stream") or not self.packing):
            raise ConfigError("Pipeline.rows", f"encoded rows live in the tiers and packed segments of a pipeline "
                                               f"that packs; the {self.loader} loader{'' if self.packing else ' without packing'}"
                                               f" reads exact rows")
        if self.loader not in ("packed", "online") and (self.cpu_tier != "belady" or self.gpu_tier != "hottest"
                                                         or not self.packing):
            raise ConfigError("Pipeline.loader", f"tier policies and packing are the packed loader's; the "
                                                 f"{self.loader} loader takes the defaults")

    def with_options(self, **changes: Any) -> Pipeline:
        """A copy with some fields changed (e.g. ``belady.with_options(name="mine", packing=False)``)."""
        return replace(self, **changes)

    def prepare_config(self, **options: Any) -> Any:
        """The `flow.prepare.PrepareConfig` of this pipeline with `options` (budgets, fanouts, ...)."""
        from .prepare import PrepareConfig

        fixed: dict[str, Any] = {"pipeline": self.name, "cpu_policy": self.cpu_tier, "gpu_policy": self.gpu_tier,
                                 "packing": self.packing, "disk_cache": self.disk_cache}
        clash = sorted(set(options) & set(fixed))
        if clash:
            raise ConfigError(clash[0], f"fixed by the {self.name} pipeline ({clash[0]}={fixed[clash[0]]!r})")
        options.setdefault("fanouts", self.fanouts)
        options.setdefault("batches", self.batches)
        if self.task != "node":
            options.setdefault("task", self.task)
        if self.rows != "exact":
            options.setdefault("rows", self.rows)
        return PrepareConfig(**fixed, **{**options, "fanouts": as_fanouts(options["fanouts"])})

    def prepare(self, store: str | os.PathLike[str], out: str | os.PathLike[str], *, force: bool = False,
                quiet: bool = False, **options: Any) -> Any:
        """Sample, plan and pack `store` into the packed dataset `out` (`flow.prepare.prepare`); its result."""
        from .prepare import prepare

        if self.loader not in ("packed", "stream"):
            raise ConfigError("pipeline", f"the {self.name} pipeline ({self.loader} loader) prepares nothing")
        return prepare(store, out, self.prepare_config(**self.history_options(store, options)), force=force,
                       quiet=quiet)

    def history_options(self, store: str | os.PathLike[str], options: dict[str, Any]) -> dict[str, Any]:
        """`options` with this pipeline's historical embedding cache (bytes of `store`'s features, its rule)
        where they do not set their own (`flow.options.history_options`)."""
        if self.history_memory in (None, 0, "0") or "history_memory" in options:
            return options
        from ..operators.formats.store import Store
        from ..operators.train.config import TrainConfig
        from .options import history_options

        return {**options, **history_options(
            self.history_memory, options.get("history_dim", TrainConfig.hidden), Store(store).feature_bytes, self,
            staleness=options.get("history_staleness"), prune=options.get("history_prune"),
            ramp=options.get("history_ramp"), cooldown=options.get("history_cooldown"))}

    def run(self, store: str | os.PathLike[str], run_dir: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
        """Train with this pipeline's loader (preparing first where it packs); the report."""
        options.setdefault("fanouts", self.fanouts)
        if self.batches != "shuffled" or "batches" in options:
            options.setdefault("batches", self.batches)
        if self.task != "node":
            options.setdefault("task", self.task)
        if self.rows != "exact":
            options.setdefault("rows", self.rows)
        if options.get("rows", "exact") != "exact" and (self.loader not in ("packed", "stream") or not self.packing):
            raise ConfigError("rows", f"the {self.name} pipeline reads exact rows (its {self.loader} loader"
                                      f"{'' if self.packing else ' packs nothing'}); encoded rows need a pipeline "
                                      "that packs them (belady, diskgnn, streaming)")
        options = pipeline_history(self, options)       # this pipeline's cache and rule, where not given
        train = self._loader_function()
        if self.loader in ("packed", "online"):
            return train(self, store, run_dir, **options)
        return train(store, run_dir, **options)

    def parameters(self) -> Mapping[str, inspect.Parameter]:
        """The keyword options `run` takes (its loader's), for callers that check options before a run."""
        params = dict(inspect.signature(self._loader_function()).parameters)
        for first in ("pipeline", "store", "run_dir"):
            params.pop(first, None)
        return params

    def _loader_function(self) -> Runtime:
        """The function that trains with this pipeline's loader (`LOADERS`), imported now."""
        return LOADERS[self.loader]()

    def describe(self) -> dict[str, Any]:
        """The definition as JSON values (policy functions by name and code hash)."""
        return {"name": self.name, "loader": self.loader, "batches": self.batches, "sampler": self.sampler,
                "fanouts": fanouts_json(self.fanouts), "gpu_tier": policy_id(self.gpu_tier),
                "cpu_tier": policy_id(self.cpu_tier), "packing": self.packing, "disk_cache": self.disk_cache,
                **({"task": self.task} if self.task != "node" else {}),
                **({"rows": self.rows} if self.rows != "exact" else {}),
                **({"history_memory": self.history_memory, "history_staleness": self.history_staleness,
                    "history_prune": self.history_prune,
                    **({"history_ramp": self.history_ramp} if self.history_ramp else {}),
                    **({"history_cooldown": self.history_cooldown} if self.history_cooldown else {})}
                   if self.history_memory not in (None, 0, "0") else {})}


def available_pipelines() -> list[str]:
    """Names of the built-in pipelines (modules of `diskflow.pipelines`), sorted."""
    from .. import pipelines

    return sorted(m.name for m in pkgutil.iter_modules(pipelines.__path__) if not m.name.startswith("_"))


def load_pipeline(name_or_path: str | os.PathLike[str]) -> Pipeline:
    """The `Pipeline` of a built-in name or of a `.py` file that defines one (at module level).

    Raises:
        ConfigError: unknown name (the message lists the available ones), a file that defines
            no `Pipeline`, or several.
        InputError: the file exists but cannot be imported.
    """
    text = os.fspath(name_or_path)
    path = Path(text)
    looks_like_path = text.endswith(".py") or os.sep in text or "/" in text
    builtin = available_pipelines()
    if looks_like_path and path.is_file():
        module = _builtin_at(path, builtin) or _import_file(path)
    elif (path.stem if looks_like_path else text) in builtin:
        module = _import_builtin(path.stem if looks_like_path else text)
    else:
        what = f"no such file {text!r}" if looks_like_path else f"unknown pipeline {text!r}"
        raise ConfigError("pipeline", f"{what}; available: {', '.join(builtin) or '(none)'}, "
                                      "or the path of a .py file that defines a diskflow.Pipeline")
    return pipeline_of(module, text)


def pipeline_of(module: ModuleType, text: str) -> Pipeline:
    """The one `Pipeline` a module defines at module level (``PIPELINE`` first, if it has one)."""
    if isinstance(getattr(module, "PIPELINE", None), Pipeline):
        return module.PIPELINE
    found = {id(v): v for v in vars(module).values() if isinstance(v, Pipeline)}
    if len(found) != 1:
        raise ConfigError("pipeline", f"{text!r} defines {'no' if not found else len(found)} diskflow.Pipeline "
                                      "objects at module level; it must define exactly one (e.g. "
                                      "pipeline = diskflow.Pipeline(\"mine\", cpu_tier=my_policy))")
    return _by_reference(next(iter(found.values())), module)


def _by_reference(pipeline: Pipeline, module: ModuleType) -> Pipeline:
    """`pipeline` with the policy functions of a user's file replaced by `FilePolicy` references, so that Dask
    workers in other processes import the file themselves instead of unpickling a function they cannot find."""
    source = getattr(module, "__file__", None)
    if source is None or not module.__name__.startswith(USER_MODULE):
        return pipeline
    changes: dict[str, Any] = {}
    for field_name in ("gpu_tier", "cpu_tier"):
        fn = getattr(pipeline, field_name)
        name = getattr(fn, "__qualname__", "")
        if callable(fn) and getattr(fn, "__module__", None) == module.__name__ and getattr(module, name, None) is fn:
            changes[field_name] = FilePolicy(source, name)
    return replace(pipeline, **changes) if changes else pipeline


def pipeline_names(text: str) -> list[str]:
    """Split a comma-separated list of pipeline names and ``.py`` paths."""
    return [t.strip() for t in str(text).split(",") if t.strip()]


def _builtin_at(path: Path, builtin: list[str]) -> ModuleType | None:
    """The built-in pipeline module whose source file is `path`, if it is one."""
    if path.stem not in builtin:
        return None
    module = _import_builtin(path.stem)
    source = getattr(module, "__file__", None)
    if source and Path(source).resolve() == path.resolve():
        return module
    return None


# ---------------------------------------------------------------------------- pipeline modules by name
# The package's two imports whose module is data, a name or a path the user gave (tests/test_imports.py checks
# that nothing else imports by name). The built-in pipelines import this module at module level; it imports
# them only here, when a name asks for one.

def _import_builtin(name: str) -> ModuleType:
    """The built-in pipeline module `name` (one of `available_pipelines`), imported now."""
    return importlib.import_module(f"{PACKAGE}.{name}")


def _import_file(path: Path) -> ModuleType:
    """Import a user's pipeline file as a fresh module."""
    return import_user_file(path, f"{USER_MODULE}_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}")
