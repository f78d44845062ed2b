"""The weight-sync benchmark's summary and tables (benchmarks/weight_sync.py measures): bandwidth
per variant, ratios to raw pair by pair, the per-phase breakdown, and whether the target holds."""

from __future__ import annotations

import statistics
from typing import Any

from rlcore.benchmarks.common import spread

SHOWN = ("raw", "raw_packed", "rlcore", "checksums", "in_process")
"""Column order of the tables."""
TARGET_RATIO = 0.85
"""Issue 5's target: rlcore's bandwidth over raw's in the same repeat (median)."""


def summarise(report: dict[str, Any], kinds: list[str], model_bytes: int) -> dict[str, Any]:
    by_kind: dict[str, list[dict[str, Any]]] = {k: [] for k in SHOWN if k in kinds}
    for run in report["runs"]:
        by_kind[run["kind"]].append(run)
    seconds = {k: [r["total_s"] for r in runs] for k, runs in by_kind.items()}
    gbps = {k: [model_bytes / 1e9 / s for s in v] for k, v in seconds.items()}
    ratios = {}
    for k in ("rlcore", "raw_packed", "checksums", "in_process"):
        if k in kinds:  # raw and k of the same repeat (neighbours, except for in_process)
            ratios[f"{k}_over_raw"] = spread([a / b for a, b in zip(gbps[k], gbps["raw"], strict=True)])
    if "raw_packed" in kinds:
        ratios["rlcore_over_raw_packed"] = spread(
            [a / b for a, b in zip(gbps["rlcore"], gbps["raw_packed"], strict=True)]
        )
    skip = {"start", "end", "num_bytes", "direct_bytes", "verified_buckets"}
    breakdown = {
        k: {
            f"{side}_{name}": statistics.median(r[side][name] for r in runs)
            for side in ("sender", "receiver")
            for name in runs[0][side]
            if name not in skip
        }
        for k, runs in by_kind.items()
    }
    uncopied = {  # share of the bytes that went from the strategy's tensor / into the engine's own
        side: statistics.median(r[side]["direct_bytes"] / r[side]["num_bytes"] for r in by_kind["rlcore"])
        for side in ("sender", "receiver")
        if by_kind.get("rlcore")
    }
    return {
        "uncopied_share": uncopied,
        "seconds": {k: spread(v) for k, v in seconds.items()},
        "gb_per_s": {k: spread(v) for k, v in gbps.items()},
        "ratios": ratios,
        "breakdown_median_s": breakdown,
        "runs": report["runs"],
    }


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    done = {name: s for name, s in result["sizes"].items() if not s.get("skipped")}
    lines = [
        f"gloo between two processes on one machine, {cfg['bucket_mb']} MiB buckets, {cfg['repeats']} "
        "alternating repeats, 1 CPU thread per process. GB/s = model bytes / wall seconds of the whole "
        "sync, median over repeats. raw = rlcore's buckets broadcast from preallocated buffers; raw "
        f"packed = the same bytes in full {cfg['bucket_mb']} MiB buckets.",
        "",
        "| model | params | MB | buckets | raw GB/s | raw packed GB/s | rlcore GB/s | checksums GB/s "
        "| in-process GB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in result["sizes"].items():
        if s.get("skipped"):
            lines.append(f"| {name} | skipped: {s['skipped']} |" + " |" * 7)
            continue
        cells = [f"{s['gb_per_s'][k]['median']:.3f}" if k in s["gb_per_s"] else "-" for k in SHOWN]
        lines.append(
            f"| {name} | {s['params'] / 1e6:.0f}M | {s['model_bytes'] / 1e6:.0f} | {s['num_buckets']} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "Bandwidth / raw's bandwidth in the same repeat, min / median / max over the repeats:",
        "",
        "| model | raw packed / raw | **rlcore / raw** | checksums / raw | in-process / raw |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in done.items():
        cells = []
        for k in SHOWN[1:]:
            r = s["ratios"].get(f"{k}_over_raw")
            mid = "-" if r is None else f"**{r['median']:.2f}**" if k == "rlcore" else f"{r['median']:.2f}"
            cells.append("-" if r is None else f"{r['min']:.2f} / {mid} / {r['max']:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Breakdown, median seconds. Sender: gather = waiting for `iter_full_weights`, pack = copying "
        "into buckets (and CRC), send = blocked in the group; receiver: receive = blocked in the "
        "group, load = the rest (`load_weights` copies; with checksums also the CRC check). In-process: "
        "gather, then copy in the load column. CPU = process CPU seconds (all threads); machine busy "
        f"cores = non-idle share of all {result['machine']['cpus']} cores during the run (/proc/stat: "
        "includes the kernel's softirq work for loopback TCP, and anyone else's load).",
        "",
        "| model | variant | wall | gather | pack | send | receive | load | sender CPU | receiver CPU "
        "| machine busy cores |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    columns = (
        "sender_gather_s", "sender_pack_s", "sender_send_s", "receiver_receive_s", "receiver_load_s",
        "sender_cpu_s", "receiver_cpu_s", "sender_machine_busy_cores",
    )  # fmt: skip
    for name, s in done.items():
        for kind, b in s["breakdown_median_s"].items():
            b = dict(b)
            if kind == "in_process":
                b["receiver_load_s"] = b.pop("sender_copy_s")
                b.pop("receiver_cpu_s")  # the receiver idles while the sender copies
            cells = [f"{b[k]:.3f}" if k in b else "-" for k in columns]
            wall = s["seconds"][kind]["median"]
            lines.append(f"| {name} | {kind} | {wall:.3f} | " + " | ".join(cells) + " |")
    uncopied = [
        f"{name}: sent {s['uncopied_share']['sender']:.0%}, received {s['uncopied_share']['receiver']:.0%}"
        for name, s in done.items()
        if s.get("uncopied_share")
    ]
    met = [
        f"{name}: {'met' if s['ratios']['rlcore_over_raw']['median'] >= TARGET_RATIO else 'NOT met'} "
        f"({s['ratios']['rlcore_over_raw']['median']:.2f}; against raw packed "
        f"{s['ratios']['rlcore_over_raw_packed']['median']:.2f})"
        for name, s in done.items()
    ]
    same = [
        f"{name}: {'yes' if all(s['weights_match'].values()) else 'NO ' + str(s['weights_match'])}"
        for name, s in done.items()
    ]
    lines += [
        "",
        "Bytes rlcore moved without a copy (sent from the strategy's own tensor, received into the "
        "engine's own parameter): " + "; ".join(uncopied),
        "",
        f"Target rlcore / raw >= {TARGET_RATIO} (median): " + "; ".join(met),
        "",
        "Weights equal to the sender's after the runs (CRC-32 of every tensor; the targets start "
        "zeroed): " + "; ".join(same),
    ]
    return "\n".join(lines)
