"""Training: batches shaped like PyG's, the models, the training loop, the packed loader (direct I/O,
staging, assembly) and the pipelined trainer with checkpoints."""
