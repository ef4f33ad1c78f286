"""One fanouts parser behind every command's ``--fanouts``: the same values accepted and one error message,
naming the option, whichever command reads it (argparse types, `diskflow run`, `bench sampler`)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from diskflow.bench import sampler as bench_sampler
from diskflow.cli import main
from diskflow.flow.options import parse_fanouts

from diskflow.errors import ConfigError

BAD = ["a,b", "5,-3", "", "10,,5", "4;4"]


def test_fanouts_accepted() -> None:
    assert parse_fanouts("10,15,-1") == (10, 15, -1)
    assert parse_fanouts(" 5, 0") == (5, 0)
    assert parse_fanouts("3", "--hops") == (3,)


@pytest.mark.parametrize("text", BAD)
def test_every_fanouts_option_refuses_bad_values_with_one_message(text: str, tiny_store: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    message = f"--fanouts: expected comma-separated integers >= -1, got {text!r}"
    with pytest.raises(ConfigError) as e:
        parse_fanouts(text)
    assert str(e.value) == message.replace("--fanouts", "fanouts", 1)      # the library names the field
    for argv in (["prepare", "belady", "--fanouts", text], ["bench", "compare", "--fanouts", text]):
        with pytest.raises(SystemExit) as stop:                 # an argparse type: refused while parsing
            main(argv)
        assert stop.value.code == 2 and message in capsys.readouterr().err, argv
    assert main(["run", "inmemory", "--dataset", str(tiny_store), "--runs-dir", str(tmp_path), "--fanouts", text]) == 2
    assert message in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    bench_sampler.add_arguments(parser)
    with pytest.raises(ConfigError) as e:
        bench_sampler.run(parser.parse_args(["--fanouts", text]))
    assert str(e.value) == message
