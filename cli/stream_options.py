"""The flags `diskflow run` adds for split and streamed runs, and `--resume RUN`; the streamed run's defaults
in their help come from `StreamConfig`."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import RUN_DEFAULTS, StreamConfig, TrainConfig
from ..errors import InputError
from .options import parse_float, parse_int

__all__ = ["RUN_OPTIONS", "add_run_arguments", "resume_dir"]

_S = StreamConfig         # its fields' defaults (class attributes), from the one place they are set


def _int_at_least(option: str, minimum: int) -> Callable[[str], int]:
    return lambda text: parse_int(option, text, minimum)


def _float_at_least(option: str, minimum: float) -> Callable[[str], float]:
    return lambda text: parse_float(option, text, minimum)


# option attribute -> (flag, parser, help): the flags `diskflow run` adds for split and streamed runs
RUN_OPTIONS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "scheduler": ("--scheduler", str, "tcp://HOST:PORT of a running Dask scheduler (default: an embedded cluster)"),
    "window": ("--window", _int_at_least("--window", 1),
               (f"streaming: superbatches staged on the GPU worker / prepared ahead of training at most (default "
                f"{_S.window}); online pipelines: batches sampled ahead, lsmgnn's lookahead (default "
                f"{RUN_DEFAULTS['online_window']})")),
    "workers": ("--workers", _int_at_least("--workers", 0), "CPU workers of the embedded cluster (default: cores - 1)"),
    "scratch": ("--scratch", str, "the embedded GPU worker's scratch directory (default RUN/scratch)"),
    "quota": ("--quota", str, "the embedded GPU worker's scratch quota, e.g. 10GiB (default: none)"),
    "hold_memory": ("--hold-memory", str, ("the embedded GPU worker's memory for staged index and samples, which "
                                           f"skip the scratch disk while they fit (default {RUN_DEFAULTS['hold_memory']}; 0: all on disk)")),
    "stage": ("--stage", str, "an fsspec URL both machines reach; superbatches travel through it instead of Dask"),
    "superbatch_size": ("--superbatch-size", _int_at_least("--superbatch-size", 1),
                        f"batches per superbatch (streaming default {_S.superbatch_size})"),
    "tier_superbatches": ("--tier-superbatches", _int_at_least("--tier-superbatches", 1),
                          f"superbatches whose counts decide the GPU tier (default {_S.tier_superbatches})"),
    "checkpoint_every": ("--checkpoint-every", _int_at_least("--checkpoint-every", 1),
                         f"superbatches between checkpoints (default {_S.checkpoint_every}; also at every epoch's end)"),
    "cpu_memory": ("--cpu-memory", str, ("trainer host memory for features: bytes (4GiB) or a share (10%%); online "
                                         "pipelines: their feature buffer with its tables and staging")),
    "gpu_memory": ("--gpu-memory", str, "GPU memory for the GPU tier: bytes or a share of the features"),
    "gpu_wait": ("--gpu-wait", _float_at_least("--gpu-wait", 0.0),
                 f"seconds to wait for a GPU-resource worker to join (default {_S.gpu_wait_s:g})"),
    "gpus": ("--gpus", lambda text: 0 if text == "all" else parse_int("--gpus", text, 1),
             ("streaming: GPU workers training data-parallel, each its share of every superbatch, gradients "
              "averaged with torch.distributed; 'all': every worker with the GPU resource when the run starts "
              f"(default {_S.gpus}; the embedded cluster starts this many)")),
    "cache": ("--cache", str, ("streaming with --gpus N: the GPU workers' CPU tiers, per-worker (each its own, "
                               "Belady over its own accesses; the default) or shared (GPU workers on one machine: "
                               "one tier of their pooled budgets in shared memory, Belady over the merged stream)")),
    "batches_per_step": ("--batches-per-step", _int_at_least("--batches-per-step", 1),
                         ("streaming: batches whose mean gradient makes one optimizer step (default "
                          f"{TrainConfig().batches_per_step}): what "
                          "--gpus N computes, on one worker")),
    "tls_ca_file": ("--tls-ca-file", str, ("--scheduler tls://...: the CA certificate the cluster's certificates "
                                           "are signed by (Dask's distributed.comm.tls.ca-file)")),
    "tls_cert": ("--tls-cert", str, "--scheduler tls://...: this client's certificate (PEM)"),
    "tls_key": ("--tls-key", str, "--scheduler tls://...: this client's private key (PEM; default: in --tls-cert)"),
    "resume": ("--resume", lambda text: True, ("continue the run in directory RUN from its last checkpoint "
                                               "(same options; RUN is used instead of a new run directory)")),
}


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the split/streamed-run flags (`RUN_OPTIONS`, ``--resume RUN`` among them) to `diskflow run`'s parser."""
    for name, (flag, _, text) in RUN_OPTIONS.items():
        metavar = {"resume": "RUN", "scheduler": "ADDRESS", "stage": "URL", "cache": "MODE", "tls_ca_file": "FILE",
                   "tls_cert": "FILE", "tls_key": "FILE", "batches_per_step": "N", "gpus": "N|all"}.get(name, name.split("_")[0].upper())
        parser.add_argument(flag, dest=name, default=None, metavar=metavar, help=text)


def resume_dir(args: argparse.Namespace) -> Path | None:
    """The run directory `--resume RUN` names (it must hold checkpoints), or None."""
    if getattr(args, "resume", None) is None:
        return None
    path = Path(args.resume)
    if not (path / "checkpoints").is_dir():
        raise InputError(path, "no checkpoints to resume from (give the run directory of the interrupted run)")
    return path
