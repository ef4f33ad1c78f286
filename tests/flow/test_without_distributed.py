"""`distributed` is optional: the test modules that need it skip without it instead of failing to import."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

NEEDS_DISTRIBUTED = ("test_stream.py", "test_two_machines.py", "test_progress.py", "test_prepare_cluster.py")
# Collect them in a fresh interpreter where `import distributed` fails, as on a machine without it (without
# tests/conftest.py: its fixtures play no part in collecting, and it imports PyG).
COLLECT = ("import sys; sys.modules['distributed'] = None; import pytest; "
           "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', '--noconftest', *sys.argv[1:]]))")


def test_modules_that_need_distributed_skip_without_it() -> None:
    here = Path(__file__).parent
    r = subprocess.run([sys.executable, "-c", COLLECT, *(str(here / m) for m in NEEDS_DISTRIBUTED)],
                       cwd=here.parent.parent, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 5, out          # pytest's "no tests collected": every module skipped, none errored
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED") and "'distributed'" in line]
    assert len(skipped) == len(NEEDS_DISTRIBUTED) and "ERROR" not in out, out


# In a fresh interpreter: `progress.compute` runs a graph on the configured local scheduler (or dask's default
# for the collection) and imports nothing of distributed, which dask would import to look for a client.
LOCAL = """
import sys, threading
import dask
from diskflow.flow.progress import compute
main = threading.get_ident()
tasks = [dask.delayed(lambda x: (x * x, threading.get_ident()))(x) for x in range(4)]
default = compute(tasks, desc="default", disable=True)
with dask.config.set(scheduler="sync"):
    sync = compute(tasks, desc="sync", disable=True)
with dask.config.set(scheduler="threads", num_workers=2):
    threads = compute(tasks, desc="threads", disable=True)
assert [r[0] for r in default] == [r[0] for r in sync] == [r[0] for r in threads] == [0, 1, 4, 9]
assert all(r[1] == main for r in sync), "sync ran tasks off the main thread"
assert all(r[1] != main for r in default + threads), "the threaded scheduler ran tasks on the main thread"
assert "distributed" not in sys.modules, "a local compute imported distributed"
with dask.config.set(scheduler="no-such-scheduler"):
    try:
        compute(tasks, desc="bad", disable=True)
    except ValueError as e:
        assert "no-such-scheduler" in str(e) or "Expected one of" in str(e), e
    else:
        raise AssertionError("an unknown scheduler name was accepted")
"""


def test_a_local_compute_never_imports_distributed() -> None:
    r = subprocess.run([sys.executable, "-c", LOCAL], capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
