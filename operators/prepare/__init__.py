"""Offline preparation of a round (docs/design.md, "The preparation graph"), in the order the data
walks: draw batches (`seeds`),
sample them (`sample`, per `superbatch`), count accesses (`count`), size and pick the tiers
(`tiers`), plan the CPU cache (`plan`), route every read (`route`), place a disk cache when disk is
tight (`search`, `reorder`, `diskcache`) and pack the misses into per-batch segments (`pack`)."""

__all__: list[str] = []
