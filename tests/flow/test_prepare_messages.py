"""What `prepare` tells before it is too late: a CPU budget too small for the trainer's buffers is one line
naming the smallest budget and a setting that would fit the given one (and that setting is accepted); the
default budget is raised on a store too small for it instead; the packed bytes are said before packing."""
from __future__ import annotations

import logging
import re
from pathlib import Path

import dask
import pytest
from diskflow.cli import main
from diskflow.flow.prepare import phases
from diskflow.operators.formats.sizes import format_bytes
from diskflow.operators.formats.store import Store

import diskflow
from diskflow.errors import ConfigError

ROUND = {"fanouts": (5, 5), "batch_size": 192, "superbatch_size": 3, "epochs": 1, "readahead": 0}
ARGS = ["--fanouts", "5,5", "--batch-size", "192", "--superbatch-size", "3", "--epochs", "1", "--readahead", "0",
        "--workers", "1"]
BUDGET = 3 << 20        # below this round's staging and I/O buffers (about 4 MiB)
CHOICE = re.compile(r"(--[a-z-]+|[a-z_]+=)\s?([\d,() ]+?)(?: \(at most [\d,]+ rows a batch\))?(?: or |$)")


@pytest.fixture(autouse=True)
def _sync_scheduler():
    with dask.config.set(scheduler="sync"):
        yield


def _choices(text: str) -> dict[str, tuple[int, ...]]:
    """The settings a refusal names, by option (flag or field), between the budget and "would fit"."""
    tail = text.split("with an empty CPU tier); ", 1)[1].rsplit(" would fit ", 1)[0]
    return {name.rstrip("="): tuple(int(v) for v in re.findall(r"\d+", value)) for name, value in CHOICE.findall(tail)}


def test_a_budget_too_small_names_the_smallest_and_a_setting_that_fits(tiny_store: Path, tmp_path: Path,
                                                                        capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError) as e:
        diskflow.prepare(tiny_store, tmp_path / "api", cpu_memory=BUDGET, **ROUND)
    api = str(e.value)
    assert e.value.option == "cpu_memory" and "\n" not in api and "the smallest budget that works is" in api
    fields = _choices(api)
    assert fields and set(fields) <= {"batch_size", "fanouts", "queue_depth"}, api

    out = tmp_path / "packed"
    assert main(["prepare", "belady", "--dataset", str(tiny_store), "--out", str(out), "--cpu-memory",
                 str(BUDGET), *ARGS]) == 2
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("diskflow prepare")]
    assert len(lines) == 1 and lines[0].startswith("diskflow prepare: error: --cpu-memory: 3.00 MiB cannot hold")
    least = re.search(r"the smallest budget that works is .* \(([\d,]+) bytes, with an empty CPU tier\)", lines[0])
    assert least and int(least.group(1).replace(",", "")) > BUDGET
    flags = _choices(lines[0])
    assert flags == {f"--{k.replace('_', '-')}": v for k, v in fields.items()}, lines[0]
    assert lines[0].endswith(f"would fit {format_bytes(BUDGET)}")

    # each named setting, alone, makes the same budget work: on the command line, and from Python
    (flag, value), *others = flags.items()
    assert main(["prepare", "belady", "--dataset", str(tiny_store), "--out", str(out), "--cpu-memory", str(BUDGET),
                 *ARGS, flag, ",".join(map(str, value))]) == 0
    assert "prepared belady" in capfd.readouterr().out
    for name, value in list(fields.items())[1:]:
        given = {name: value if name == "fanouts" else value[0]}
        r = diskflow.prepare(tiny_store, tmp_path / name, cpu_memory=BUDGET, **{**ROUND, **given})
        assert r.figures["cpu_memory"] == BUDGET and r.figures["staging_bytes"] + r.figures["io_buffer_bytes"] <= BUDGET
    assert len(others) == len(fields) - 1


def test_the_default_budget_is_raised_on_a_small_store_and_the_users_is_refused(
        tiny_store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    st = Store(tiny_store)
    with caplog.at_level(logging.INFO, logger="diskflow"):
        r = diskflow.prepare(tiny_store, tmp_path / "default", **ROUND)        # cpu_memory: the default, 10%
    f = r.figures
    assert st.feature_bytes // 10 < f["cpu_memory"] == f["staging_bytes"] + f["io_buffer_bytes"] and f["cpu_rows"] == 0
    assert any(m.startswith("cpu_memory: the default (") and "the smallest that works" in m for m in caplog.messages)
    with pytest.raises(ConfigError, match=r"^cpu_memory: .* cannot hold the trainer's staging buffers"):
        diskflow.prepare(tiny_store, tmp_path / "given", cpu_memory="10%", **ROUND)
    # the command: the raised default is said before the pack line, and in the summary
    capfd.readouterr()
    assert main(["prepare", "belady", "--dataset", str(tiny_store), "--out", str(tmp_path / "cli"), *ARGS]) == 0
    captured = capfd.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.startswith(("pack:", "--cpu-memory:"))]
    assert [ln.split(":")[0] for ln in lines] == ["--cpu-memory", "pack"], captured.err
    assert lines[0].startswith("--cpu-memory: the default (") and "the smallest that works" in lines[0]
    assert re.search(r"--cpu-memory +[\d.]+ [KM]iB \(the default, raised\): CPU tier 0 B", captured.out)


@pytest.fixture(scope="module")
def buffers(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> int:
    """This round's staging and I/O buffers: the smallest CPU budget that works (an empty CPU tier)."""
    with dask.config.set(scheduler="sync"):
        f = diskflow.prepare(tiny_store, tmp_path_factory.mktemp("buffers") / "p", cpu_memory="1GiB", **ROUND).figures
    return int(f["staging_bytes"] + f["io_buffer_bytes"])


def test_the_packed_bytes_are_said_before_packing(tiny_store: Path, tmp_path: Path, buffers: int,
                                                  caplog: pytest.LogCaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[int] = []
    pack_shard = phases.pack_shard

    def counting(*args, **kwargs):
        said.append(sum(m.startswith("pack: ") for m in caplog.messages))
        return pack_shard(*args, **kwargs)

    monkeypatch.setattr(phases, "pack_shard", counting)
    st = Store(tiny_store)
    with caplog.at_level(logging.INFO, logger="diskflow"):
        r = diskflow.prepare(tiny_store, tmp_path / "packed", cpu_memory=buffers, **ROUND)     # an empty CPU tier
    assert said and all(n == 1 for n in said), "one line, logged before any pack task ran"
    line = next(m for m in caplog.messages if m.startswith("pack: "))
    used = r.figures["disk_used_bytes"]
    assert used > 4 * st.feature_bytes
    assert line.startswith(f"pack: about to write {format_bytes(used)} ({used:,} bytes) of packed segments "
                           f"({used / st.feature_bytes:.1f}x the {format_bytes(st.feature_bytes)} of features) to "
                           f"{tmp_path / 'packed'}, ")
    assert re.search(r", [\d.]+ [KMGT]?i?B free there; disk_budget SIZE bounds it", line), line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="diskflow"):
        diskflow.prepare(tiny_store, tmp_path / "cached", cpu_memory="1GiB", **ROUND)     # every row in the tier
    line = next(m for m in caplog.messages if m.startswith("pack: "))
    assert line.startswith("pack: about to write 0 B (0 bytes)") and "disk_budget" not in line


def test_the_command_says_the_packed_bytes_before_its_summary(tiny_store: Path, tmp_path: Path, buffers: int,
                                                             capfd: pytest.CaptureFixture[str]) -> None:
    """The command line: the line on stderr names --disk-budget, its bytes are the manifest's."""
    out = tmp_path / "packed"
    assert main(["prepare", "belady", "--dataset", str(tiny_store), "--out", str(out), "--cpu-memory", str(buffers),
                 *ARGS]) == 0
    captured = capfd.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("pack:")]
    used = diskflow.datasets.read_manifest(out)["figures"]["disk_used_bytes"]
    assert len(lines) == 1 and f" ({used:,} bytes) of packed segments " in lines[0] and lines[0].endswith(
        "; --disk-budget SIZE bounds it (the segmented disk cache)"), captured.err
    assert captured.out.startswith("prepared belady")
