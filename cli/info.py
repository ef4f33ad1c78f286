"""`diskflow info PATH`: what a raw dataset, store or run directory holds, from its manifest or report."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import InputError
from ..sizes import format_bytes

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="summarise a raw dataset, a store or a run directory",
                       description="Print the manifest summary of a diskflow directory (raw dataset, store) "
                                   "or the final figures of a run directory.")
    p.add_argument("path", help="directory to describe")
    p.add_argument("--json", action="store_true", help="print the whole manifest/report as JSON")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..datasets import read_manifest

    path = Path(args.path)
    if not path.is_dir():
        raise InputError(path, "no such directory")
    manifest = read_manifest(path)
    report_path = path / "report.json"
    if manifest is None and report_path.is_file():
        manifest = json.loads(report_path.read_text())
        manifest.setdefault("format", "diskflow-run")
    if manifest is None:
        raise InputError(path, "no manifest.json or report.json here: not a finished diskflow output")
    if args.json:
        print(json.dumps(manifest, indent=2, sort_keys=True))
        return 0
    kind = manifest.get("format", "?")
    print(f"{path}: {kind}")
    for key in ("num_nodes", "num_edges", "num_classes"):
        if key in manifest:
            print(f"  {key:<14} {manifest[key]:,}")
    feats = manifest.get("features")
    if isinstance(feats, dict):
        rows = int(manifest.get("num_nodes", 0))
        print(f"  {'features':<14} dim={feats['dim']} dtype={feats['dtype']} shards={len(feats['shards'])} "
              f"({format_bytes(rows * int(feats['row_bytes']))})")
    if "feature_bytes" in manifest:
        print(f"  {'feature_bytes':<14} {format_bytes(manifest['feature_bytes'])}")
    if "split_counts" in manifest:
        print(f"  {'splits':<14} " + ", ".join(f"{k}={v:,}" for k, v in manifest["split_counts"].items()))
    if "final" in manifest:
        print(f"  {'final':<14} " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                                for k, v in manifest["final"].items()))
    return 0
