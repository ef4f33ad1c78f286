"""The diskflow page's address, printed beside the Dask dashboard's by every command that starts or joins a
cluster; or, where the scheduler runs without diskflow's plugin (a plain ``dask scheduler``), why there is none."""
from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urljoin

__all__ = ["ABSENT", "METADATA", "client_links", "log_links", "log_remote_links", "page_link", "register",
           "remote_links"]

METADATA = ["diskflow", "page"]         # set by `flow.dashboard.page.DashboardPlugin` on the scheduler
ABSENT = "absent (the scheduler runs without diskflow's plugin: start it with `diskflow scheduler`)"


def page_link(dashboard: str | None, route: str | None) -> str | None:
    """The page's URL next to a dashboard link (``http://HOST:8787/status`` -> ``http://HOST:8787/diskflow``)."""
    if not dashboard or not route:
        return None
    return urljoin(dashboard, route.lstrip("/"))


def client_links(client: Any) -> tuple[str | None, str | None]:
    """(the dashboard's link, the diskflow page's link or None) of a connected client's scheduler."""
    dashboard = client.dashboard_link
    try:
        route = client.get_metadata(METADATA, default=None)
    except Exception:  # noqa: BLE001 - any failure of an old or foreign scheduler: no page
        route = None
    return dashboard, page_link(dashboard, route)


def register(client: Any) -> None:
    """Add diskflow's scheduler plugin (`flow.dashboard.page`) to the scheduler of an embedded cluster."""
    from .page import DashboardPlugin

    client.register_plugin(DashboardPlugin())


def log_links(client: Any, log: logging.Logger) -> None:
    """Log (INFO) ``Dask dashboard: URL`` and ``diskflow page:  URL`` (or that it is absent, and why)."""
    dashboard, page = client_links(client)
    log.info("Dask dashboard: %s", dashboard or "(no dashboard: install bokeh)")
    if dashboard:
        log.info("diskflow page:  %s", page or ABSENT)


def remote_links(address: str, connection_args: dict[str, Any] | None = None, timeout: float = 5.0
                 ) -> tuple[str | None, str | None]:
    """(dashboard link, page link or None) of the scheduler at `address`, asked over Dask's own RPC (a worker
    about to join it has no client). Raises OSError when the scheduler does not answer."""
    import asyncio

    from distributed.comm import get_address_host
    from distributed.core import rpc
    from distributed.utils import format_dashboard_link

    async def ask() -> tuple[dict[str, Any], Any]:
        async with rpc(address, connection_args=connection_args or {}, timeout=timeout) as r:
            info = await r.identity()
            try:
                route = await r.get_metadata(keys=METADATA, default=None)
            except Exception:  # noqa: BLE001 - an old or foreign scheduler: no page
                route = None
            return info, route

    info, route = asyncio.run(asyncio.wait_for(ask(), timeout))
    port = (info.get("services") or {}).get("dashboard")
    dashboard = format_dashboard_link(get_address_host(address), port) if port else None
    return dashboard, page_link(dashboard, route)


def log_remote_links(address: str, connection_args: dict[str, Any] | None, log: logging.Logger) -> None:
    """`log_links` for a worker joining the scheduler at `address`; nothing when it does not answer yet."""
    try:
        dashboard, page = remote_links(address, connection_args)
    except (OSError, TimeoutError, ValueError):
        return
    log.info("Dask dashboard: %s", dashboard or "(none)")
    if dashboard:
        log.info("diskflow page:  %s", page or ABSENT)
