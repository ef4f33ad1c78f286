"""The defaults that several option sets share, each stated once; imports nothing.

A round's shape is an option of the trainer (`operators.train.config.TrainConfig`), of prepare and of a
streamed run (`operators.prepare.round.RoundOptions`) and of a pipeline (`flow.pipeline.Pipeline`), so its
defaults sit below all of them. A default that one dataclass alone holds is stated in that dataclass (the
history cache's in `operators.prepare.history`); everything else takes it from there, signatures included
(``lr: float = TrainConfig.lr``), and `diskflow.config` gathers them for the commands.
"""
from __future__ import annotations

__all__ = ["BATCH_SIZE", "CPU_SHARE", "DEVICE", "FANOUTS", "HOLD_MEMORY", "INGEST_MEMORY", "QUEUE_DEPTH", "SEED"]

FANOUTS: tuple[int, ...] = (10, 10, 10)     # neighbours sampled per hop
BATCH_SIZE = 1024                           # seeds per minibatch
SEED = 0                                    # batch order, sampling and the model's initialisation
DEVICE = "cpu"                              # the training device
QUEUE_DEPTH = 2                             # the pipelined trainer's queues between stages (and prepare's
                                            # reserve for the batches it keeps in flight)
CPU_SHARE = 0.10                            # the feature budgets' default share of the feature bytes (prepare's
                                            # cpu_memory, the online loaders' buffer, PyG's cache_memory)
INGEST_MEMORY = "1GiB"                      # the memory one ingest task may use (sets shard and bucket sizes)
# a streamed run's GPU worker holds staged superbatches' index and samples in memory up to this (the rest go
# to the scratch disk): the bench's graph takes about 18 MiB per superbatch of 32 batches, a window of 3 (and
# the one training) about 72 MiB
HOLD_MEMORY = "256MiB"
