"""The Dask cluster a command runs on: an embedded LocalCluster, or a remote scheduler."""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError, DiskflowError
from .dashboard.links import log_links
from .dashboard.links import register as register_page
from .security import refusal

__all__ = ["client_session", "dask_client"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def dask_client(scheduler: str | None = None, n_workers: int | None = None,
                threads_per_worker: int = 1, memory_limit: str | int = "auto",
                quiet: bool = False, processes: bool = True, security: object = None) -> Iterator[object]:
    """A `distributed.Client` for the duration of a command; logs the dashboard's and the diskflow page's
    addresses (the embedded cluster's scheduler gets the page, `flow.dashboard.page`). Every command that starts
    or joins a cluster shows them, with or without progress bars; `quiet` (tests) logs none.

    Without `scheduler`, starts an embedded LocalCluster (one single-threaded worker
    process per core by default); with it, connects to `tcp://HOST:PORT` and fails
    with a clear error (not a hang) when the scheduler cannot be reached, and one line
    (`flow.security.SchedulerRefused`) when it refuses this client's certificate. `security` (a
    `distributed.Security`, `flow.roles.tls_security`): a ``tls://`` scheduler's, or the embedded
    cluster's, which then listens on ``tls://``.
    """
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    if scheduler:
        try:
            client = Client(scheduler, timeout="15s", **({"security": security} if security else {}))
        except (OSError, TimeoutError) as e:
            refused = refusal(scheduler, e, security)
            if refused is not None:
                raise refused from None
            raise DiskflowError(f"cannot reach the Dask scheduler at {scheduler} ({e})") from e
        cluster = None
    else:
        n = n_workers or max(1, os.cpu_count() or 1)
        if n < 1:
            raise ConfigError("workers", f"must be >= 1, got {n}")
        tls = {"security": security, "protocol": "tls://"} if security is not None else {}
        cluster = LocalCluster(n_workers=n, threads_per_worker=threads_per_worker, processes=processes,
                               memory_limit=memory_limit, dashboard_address=":0", silence_logs=logging.CRITICAL,
                               **tls)
        client = Client(cluster, **({"security": security} if security is not None else {}))
    try:
        with client_session(client, log, quiet=quiet, embedded=cluster is not None):
            yield client
    finally:
        if cluster is not None:
            cluster.close()


@contextlib.contextmanager
def client_session(client: Any, log: logging.Logger, *, quiet: bool, embedded: bool,
                   workers: int = 0) -> Iterator[Any]:
    """Hand `client` out for a command and close it afterwards, as every command that starts or joins a cluster
    does: first wait for `workers` workers (0: none), give an `embedded` cluster's scheduler the diskflow page
    (`flow.dashboard.page`), and log the dashboard's and the page's addresses to `log` unless `quiet`."""
    try:
        if workers:
            client.wait_for_workers(workers, timeout=120)
        if embedded:
            register_page(client)
        if not quiet:
            log_links(client, log)
        yield client
    finally:
        client.close()
