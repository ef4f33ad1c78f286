"""Training: one `session.TrainSession` (configured by `config.TrainConfig`) that every pipeline trains
with over the loader it chooses; the per-batch step (`loop`), batches shaped like PyG's (`batches`),
the models, the packed loader (direct I/O, staging, assembly) and the pipelined packed trainer with
checkpoints (`trainer`)."""
