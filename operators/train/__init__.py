"""Training: one `session.TrainSession` (configured by `config.TrainConfig`) that every pipeline trains
with over the loader it chooses; the per-batch step (`loop`), batches shaped like PyG's (`batches`),
the models, the packed loader (`loader`; a batch's direct-I/O reads and assembly in `assemble`, its
memory figures and budget check in `memory`, its stage threads in `pipe`) and the pipelined packed
trainer with checkpoints (`trainer`)."""

__all__: list[str] = []
