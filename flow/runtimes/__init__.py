"""The runtimes behind the pipelines' loaders: how each loader trains (`flow.pipeline.LOADERS` names them).

`memory` (every feature in RAM, the reference), `mmap` (memory maps and the page cache), `packed` (prepare,
then the pipelined direct-I/O trainer), `online` (no preparation: GNNDrive's and LSM-GNN's extraction into a
fixed buffer) and `stream` (prepared on CPU workers while the GPU workers train). The pipelines themselves
(`diskflow.pipelines`) are declarations that name one of these.
"""

__all__: list[str] = []
