"""`distributed` is optional: the test modules that need it skip without it instead of failing to import."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

NEEDS_DISTRIBUTED = ("test_stream.py", "test_two_machines.py", "test_progress.py", "test_prepare_cluster.py")
# Collect them in a fresh interpreter where `import distributed` fails, as on a machine without it.
COLLECT = ("import sys; sys.modules['distributed'] = None; import pytest; "
           "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', *sys.argv[1:]]))")


def test_modules_that_need_distributed_skip_without_it() -> None:
    here = Path(__file__).parent
    r = subprocess.run([sys.executable, "-c", COLLECT, *(str(here / m) for m in NEEDS_DISTRIBUTED)],
                       cwd=here.parent.parent, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 5, out          # pytest's "no tests collected": every module skipped, none errored
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED") and "'distributed'" in line]
    assert len(skipped) == len(NEEDS_DISTRIBUTED) and "ERROR" not in out, out
