"""The Dask cluster a command runs on: a client, the scheduler's and the workers' roles, and TLS.

`client` opens a ``distributed.Client`` for a block of work (an embedded ``LocalCluster``, or a running
scheduler's); `register_plugin` gives its workers diskflow's worker setup. `scheduler_argv`,
`worker_argv`, `set_worker_config` and `run_dask_cli` are `diskflow scheduler` and `diskflow worker`:
Dask's own ``dask scheduler``/``dask worker`` with diskflow's settings. `check_tls` checks a process's
TLS files against the address it reaches before Dask starts, and `probe` turns a scheduler that refuses
this process's certificate into one line (`docs/security.md`).

    from diskflow.cluster import check_tls, client

    security = check_tls("tls://10.0.0.5:8786", "ca.pem", "me.pem", "me.key").security()
    with client("tls://10.0.0.5:8786", security=security) as c:
        diskflow.prepare("store", "packed")       # runs on `c`'s cluster
"""
from __future__ import annotations

import logging
from typing import Any

from .flow.cluster import dask_client as client
from .flow.roles import run_dask_cli, scheduler_argv, set_worker_config, worker_argv
from .flow.security import TLSFiles, check_tls, probe

__all__ = ["TLSFiles", "check_tls", "client", "log_links", "probe", "register_plugin", "run_dask_cli",
           "scheduler_argv", "set_worker_config", "worker_argv"]

log = logging.getLogger(__name__)


def register_plugin(client: Any) -> None:
    """Register diskflow's `WorkerPlugin` with `client`'s workers, so that each reuses the memory it frees
    between tasks and finds its scratch settings, as in a streamed run (`diskflow.prepare` does this on the
    cluster it starts itself)."""
    from .flow.plugin import DiskflowPlugin

    client.register_plugin(DiskflowPlugin())


def log_links(address: str, files: TLSFiles, role: str = "worker") -> None:
    """Log (INFO) the Dask dashboard's address of the scheduler at `address` and the diskflow page's beside it,
    or that the page is absent (a scheduler without diskflow's plugin); nothing while it does not answer."""
    from .flow.dashboard.links import log_remote_links

    security = files.security(role)
    log_remote_links(address, security.get_connection_args(role) if security is not None else None, log)
