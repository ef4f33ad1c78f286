"""``dask scheduler --preload diskflow.flow.dashboard.preload``: the scheduler with diskflow's page.

`diskflow scheduler` passes it; a scheduler started by hand gets the page the same way. It prints the
page's address once the scheduler listens (Dask logs its dashboard's just before).
"""
from __future__ import annotations

from typing import Any

from .page import DashboardPlugin

__all__ = ["dask_setup"]


def dask_setup(scheduler: Any) -> None:
    """Dask's preload hook: add the plugin (Dask starts it after the preloads, with the other plugins)."""
    scheduler.add_plugin(DashboardPlugin(announce=True))
