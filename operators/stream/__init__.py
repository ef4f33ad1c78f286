"""Streaming: pack a superbatch on a CPU worker, ship it to the GPU worker's scratch disk, train it
there while the next ones are prepared."""

__all__: list[str] = []
