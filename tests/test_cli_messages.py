"""Messages a user meets following the README, the user guide and ``--help``: each mistake ends in one line that
names the input, the fault and what to run instead (exit status 2 on the command line), and the help says what
the guide says."""
from __future__ import annotations

import pytest
from diskflow.cli import main


def test_run_help_says_a_pipeline_file_defines_a_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a .py file that defines a diskflow.Pipeline" in text
    assert "run(store" not in text
