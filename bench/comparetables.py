"""The tables `diskflow bench compare` prints from its figures (`compare.run`'s return value).

Kept apart from `bench.compare`, which measures: this module only formats what the figures already
hold (the pipelines side by side, accuracy gaps, the ratios against their targets, the staleness
sweep, identical losses and samples), so the wording of a table changes without touching how a run
is measured, and the measuring reads without the text.
"""
from __future__ import annotations

from typing import Any

from ..operators.formats.sizes import format_bytes
from .common import print_table
from .compare import SWEPT, TARGETS, TOTAL_EPOCHS

__all__ = ["print_figures"]


def _epochs(n: int | None) -> str:
    return "-" if n is None else f"{n} epoch{'s' if n > 1 else ''}"


def _b(n: float | None) -> str:
    return "-" if n is None else format_bytes(n)


def _s(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_figures(f: dict[str, Any]) -> None:
    """Print `run`'s figures: the pipelines side by side, accuracy gaps, ratios against their targets,
    the staleness sweep, and whether losses and samples are identical."""
    c, ds = f["config"], f["dataset"]
    cg = ("NO memory limits (--no-cgroup): the out-of-core figures are not out of core" if f["no_cgroup"] else
          f"each out-of-core pipeline's runs in memory cgroups ({f['cgroup']}), page cache counted: data path "
          f"(--model none) limited to {_b(f['data_cgroup_limit_bytes'])} = allowance {_b(f['data_allowance_bytes'])}"
          f" + feature budget {_b(f['feature_budget_bytes'])}; model runs to {_b(f['cgroup_limit_bytes'])} = "
          f"allowance {_b(f['allowance_bytes'])} + feature budget")
    split = f["budget_split"]
    pool, one = split["assembled_batches"], split["assembled_batch_bytes"]
    allowance_text = ("given with --allowance (both kinds of run)" if f["allowance_probe_rss_bytes"] is None else
                      f"measured: data path = peak RSS {_b(f['data_allowance_probe_rss_bytes'])} of a process importing "
                      f"torch/PyG and holding labels and all samples, + {f['allowance_margin']:.0%}, + the {pool} "
                      f"assembled batches of the largest batch a CPU trainer holds at queue depth "
                      f"{f['config']['queue_depth']} ({_b(pool * one)}; on a GPU they live in device memory); model = "
                      f"peak RSS {_b(f['allowance_probe_rss_bytes'])} of that process after training the largest batch, "
                      f"+ {f['allowance_margin']:.0%}, + the {pool - 1} other assembled batches ({_b((pool - 1) * one)})")
    title = (f"compare on {ds['nodes']:,} nodes x {ds['dim']} {ds['dtype']} ({_b(f['feature_bytes'])} of features, "
             f"{ds['shards']} shards), {ds['train']:,} training nodes: {f['epochs']} epochs x "
             f"{f['batches_per_epoch']} batches of {c['batch_size']}, fanouts {','.join(map(str, c['fanouts']))}, "
             f"GraphSAGE hidden {c['hidden']}, same stored samples for every pipeline"
             + ("" if not any(p.get("history") or p.get("batches") == "partition" for p in f["pipelines"].values())
                else " but the OUTRE ones (their own batches and pruned subtrees)")
             + (f"; best of {c['repeats']} interleaved repeats" if c["repeats"] > 1 else "") + "\n"
             f"{cg}\nallowance: {allowance_text}\nfeature budget: CPU tier {_b(split['cpu_tier_bytes'])} "
             f"({split['cpu_tier_bytes'] / f['feature_budget_bytes']:.0%}) + staged misses in "
             f"{split['staging_buffers']} buffers of {_b(split['staging_piece_bytes'])} ({_b(split['staging_bytes'])}; "
             f"largest batch {f['max_batch_rows']:,} rows) + I/O buffers {_b(split['io_buffer_bytes'])}; "
             "inmemory unlimited")
    rows = []
    for name, p in f["pipelines"].items():
        note = []
        if p["cut_short"]:
            note.append(p["cut_short"])
        if name == "inmemory":
            note.append("no limit")
        if name == "mmap":
            note.append("amp vs belady's misses")
        if p.get("batches") == "partition" and p.get("partition"):
            note.append(f"partition batches ({p['partition']['parts']:,} parts)")
        if p.get("history"):
            h = p["history"]
            note.append(f"history S={h['staleness']} {_b(h['bytes'])} ({h['rows']:,} embeddings; "
                        f"{h['pruned']:,} subtrees pruned, {h.get('prune', 'subtree')} rule)")
        if p.get("memory_split"):
            ms = p["memory_split"]
            note.append(f"memory split: {ms['chosen']['share']:.1%} of the caches' {_b(ms['budget'])} to embeddings")
        if p.get("online"):
            o = p["online"]
            note.append(f"{o['policy']} buffer {o['slots']:,} rows, {_b((o['memory'] or {}).get('total_bytes'))} fixed"
                        + (f", window {o['window']}" if o.get("window") else "")
                        + (f", hit rate {o['hits'] / o['rows']:.1%}" if o["rows"] else "")
                        + (f", reads in {o['read_unit']}-byte units through gaps of {_b(o['gap_bytes'])}"
                           if o.get("read_unit") else ""))
        if p["errors"]:
            note.append("; ".join(f"{k}: {v}" for k, v in p["errors"].items()))
        rows.append({"pipeline": name, "data epoch s": _s(p["data_epoch_s"]), "disk floor s": _s(p["disk_floor_s"]),
                     "sage epoch s": _s(p["epoch_s"]), "disk read": _b(p["disk_read_bytes"]), "plan misses": _b(p["plan_miss_bytes"]),
                     "read amp": _s(p["read_amplification"], ".3g"), "peak RSS": _b(p["peak_rss_bytes"]),
                     "cgroup peak data": _b(p["data_cgroup_peak_bytes"]),
                     "cgroup peak model": _b(p["cgroup_peak_bytes"]), "test acc": _s(p["test_acc"], ".4f"),
                     "first batch s": _s(p.get("first_batch_s")),
                     **{f"{e} ep. + prep s": _s((p.get("total_s") or {}).get(str(e)), ".1f") for e in TOTAL_EPOCHS},
                     "note": ", ".join(note)})
    print_table(title, rows, ["pipeline", "data epoch s", "disk floor s", "sage epoch s", "disk read", "plan misses",
                              "read amp", "peak RSS", "cgroup peak data", "cgroup peak model", "test acc",
                              "first batch s", *(f"{e} ep. + prep s" for e in TOTAL_EPOCHS), "note"])
    print(f"disk floor: an epoch's disk read at the disk's sequential bandwidth. "
          f"disk read: /proc/self/io read_bytes of the run's training epochs (data-path run, whole round); "
          f"sample files ({_b(f['sample_bytes'])}) read before each epoch's clock; page cache dropped before every "
          f"run ({f['page_cache_drop'].split(' on ')[0]}); device read_ahead_kb {f['read_ahead_kb']}. "
          f"first batch s: an epoch's start to its first trained batch (data-path run). E ep. + prep s: time to "
          f"train E epochs (GraphSAGE epochs) plus the pipeline's preparation ('-': a cache whose time is unknown)")
    enc = f.get("encoded_rows") or {}
    if enc:
        print_table("belady with encoded rows, beside exact belady (same samples, seeds and limits)",
                    [{"pipeline": n, "row bytes": f"{e['row_bytes']} / {e['exact_row_bytes']}",
                      "CPU tier rows": f"{e['cpu_rows']:,} / {e['exact_cpu_rows']:,}",
                      "CPU-tier hits": f"{_s(e['cpu_hit_rate'], '.1%')} / {_s(e['exact_cpu_hit_rate'], '.1%')}",
                      "disk read": f"{_b(e['disk_read_bytes'])} / {_b(e['exact_disk_read_bytes'])}",
                      "data epoch s": f"{_s(e['data_epoch_s'])} / {_s(e['exact_data_epoch_s'])}",
                      "test acc": f"{_s(e['test_acc'], '.4f')} / {_s(e['exact_test_acc'], '.4f')}"}
                     for n, e in enc.items()],
                    ["pipeline", "row bytes", "CPU tier rows", "CPU-tier hits", "disk read", "data epoch s", "test acc"])
    acc = f.get("accuracy") or {}
    if acc.get("pipelines"):
        print_table(f"test accuracy after {_epochs(acc['epochs'])}, beside inmemory's (gap: inmemory's minus the "
                    "pipeline's, points)",
                    [{"pipeline": n, "test acc": _s(a["test_acc"], ".4f"), "inmemory": _s(a["inmemory_test_acc"], ".4f"),
                      "gap, points": _s(a["gap_points"], "+.2f")} for n, a in acc["pipelines"].items()],
                    ["pipeline", "test acc", "inmemory", "gap, points"])
    r = f["ratios"]
    bel = f["pipelines"].get("belady", {})
    lines = [
        ((f"belady data path / inmemory data path (belady / its disk floor: "
          f"{_s(r.get('belady_data_vs_disk_floor'))}x)"), r["belady_data_vs_inmemory"]),
        ("ginex / belady data path", r["ginex_over_belady"]),
        ("mmap / belady data path", r["mmap_over_belady"]),
        ("belady sage epoch / inmemory sage epoch", r["belady_model_vs_inmemory"]),
        ((f"belady sequential / pipelined sage epoch ({_s(bel.get('sequential_epoch_s'))} s / "
          f"{_s(bel.get('epoch_s'))} s; overlap can give at most {_s(bel.get('pipelined_bound'))}x)"),
         r["pipelined_speedup"]),
        ((f"belady sequential / pipelined {bel.get('io_model')} epoch, I/O-bound, {bel.get('io_threads')} torch "
          f"thread(s) ({_s(bel.get('io_sequential_epoch_s'))}"
          f" s / {_s(bel.get('io_model_epoch_s'))} s; pipelined = {_s(r.get('belady_io_model_vs_data'))}x the data "
          f"path alone)"), r["pipelined_speedup_io_bound"]),
        ((f"loader read bw {_b(f['loader_read_bw'])}/s / disk sequential {_b(f['seq_read_bw'])}/s (without crc "
          f"checks: {_b(bel.get('loader_read_bw_no_crc'))}/s)"), r["loader_over_seq_bw"]),
        (f"belady disk read / {SWEPT} disk read (bytes per epoch)", r.get("belady_over_outre_bytes")),
        ((f"inmemory test acc - {SWEPT} test acc, points, after {f['epochs']} epochs (random batches, no history "
          f"against partition batches and history)"), r.get("outre_acc_gap_points")),
        ("ginex / gnndrive data path", r.get("ginex_over_gnndrive")),
        ("mmap / gnndrive data path", r.get("mmap_over_gnndrive")),
        ((f"lsmgnn cache misses / belady plan misses, bytes of rows (its true disk read, whole pages: "
          f"{_s(r.get('lsmgnn_disk_over_belady_plan'), '.3g')}x)"), r.get("lsmgnn_misses_over_belady_plan")),
        ("belady float16 rows / exact: disk bytes", r.get("belady_float16_bytes_vs_exact")),
        ("belady float16 rows / exact: data-path epoch", r.get("belady_float16_data_vs_exact")),
        ("belady exact - float16 rows: test accuracy, points", r.get("belady_float16_acc_gap_points")),
        ("belady int8 rows / exact: disk bytes", r.get("belady_int8_bytes_vs_exact")),
        ("belady exact - int8 rows: test accuracy, points", r.get("belady_int8_acc_gap_points")),
    ]
    rows = []
    for (text, value), (key, (op, target)) in zip(lines, TARGETS.items()):
        ok = None if value is None else (value <= target if op == "<=" else value >= target)
        met = "-" if ok is None else ("yes" if ok else "NO")
        bound = bel.get("pipelined_bound")
        if key == "pipelined_speedup" and not ok and bound is not None and bound < target:
            met = "n/a: not I/O bound"
        rows.append({"ratio": text, "value": _s(value, ".3g"), "target": f"{op} {target:g}", "met": met})
    print_table("ratios (one run, same samples; this machine is shared and noisy)", rows,
                ["ratio", "value", "target", "met"])
    if f.get("staleness_sweep"):
        print_table(f"{SWEPT} at other history staleness thresholds (same run; each its own memory split)",
                    [{"staleness": x["staleness"], "disk read per epoch": _b(x["disk_read_bytes_per_epoch"]),
                      "data epoch s": _s(x["data_epoch_s"]), "sage epoch s": _s(x["epoch_s"]),
                      "test acc": _s(x["test_acc"], ".4f"), "gap, points": _s(x.get("gap_points"), "+.2f"),
                      "subtrees pruned": "-" if x["pruned"] is None
                      else f"{x['pruned']:,}", "embeddings' share": "-" if x.get("history_share") is None
                      else f"{x['history_share']:.1%}"} for x in f["staleness_sweep"]],
                    ["staleness", "disk read per epoch", "data epoch s", "sage epoch s", "test acc", "gap, points",
                     "subtrees pruned",
                     "embeddings' share"])
    for n, same in (f.get("online_losses_identical") or {}).items():
        cross = (f.get("crossover_epochs") or {}).get(n)
        cross_data = (f.get("crossover_epochs_data") or {}).get(n)
        bel_p = f["pipelines"].get("belady", {}).get("prepare_s")
        print(f"losses of {n} and inmemory identical epoch by epoch: {'-' if same is None else ('yes' if same else 'NO')}"
              f"; belady (prepare {_s(bel_p, '.1f')} s + its epochs) beats {n} from {_epochs(cross)} on with "
              f"GraphSAGE on this machine, from {_epochs(cross_data)} on with the data path alone (a trainer as "
              "fast as a GPU's)")
    ident = f["losses_identical"]
    print(f"losses of belady and inmemory identical epoch by epoch: "
          f"{'-' if ident is None else ('yes' if ident else 'NO')}; samples identical across prepared datasets: "
          f"{'yes' if f['samples_identical'] else 'NO'}; machine load average {f['load_avg'][0]:.1f} -> "
          f"{f['load_avg'][1]:.1f} on {f['cores']} cores")
