"""A Dask callback that records which tasks the local scheduler ran, for tests that check a graph's work."""
from __future__ import annotations

from typing import Any

from dask.callbacks import Callback
from dask.utils import key_split


class TaskKeys(Callback):
    """Records the key of every task the local scheduler runs."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[str] = []

    def _pretask(self, key: Any, dsk: Any, state: Any) -> None:
        self.keys.append(str(key))

    def groups(self) -> set[str]:
        """The task groups (key prefixes) that ran: which stages did work."""
        return {key_split(k) for k in self.keys}
