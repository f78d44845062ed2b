"""The weight-sync benchmark's summary and tables (benchmarks/weight_sync.py measures): bandwidth
per variant, ratios to raw pair by pair, the per-phase breakdown, and whether the target holds."""

from __future__ import annotations

import statistics
from typing import Any

from rlcore.benchmarks.common import spread

SHOWN = ("raw", "raw_packed", "rlcore", "checksums", "in_process", "reload")
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
    for k in ("rlcore", "raw_packed", "checksums", "in_process", "reload"):
        if k in kinds:  # raw and k of the same repeat (neighbours, except for in_process)
            ratios[f"{k}_over_raw"] = spread([a / b for a, b in zip(gbps[k], gbps["raw"], strict=True)])
    if "raw_packed" in kinds:
        ratios["rlcore_over_raw_packed"] = spread(
            [a / b for a, b in zip(gbps["rlcore"], gbps["raw_packed"], strict=True)]
        )
    if "reload" in kinds:  # rlcore against the wire, then the engine's load, one after the other
        serial = [w + r for w, r in zip(seconds["raw"], seconds["reload"], strict=True)]
        ratios["rlcore_over_serial"] = spread([t / s for s, t in zip(seconds["rlcore"], serial, strict=True)])
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
        if by_kind.get("rlcore") and "direct_bytes" in by_kind["rlcore"][0][side]  # vLLM reloads: copies all
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
    vllm = cfg.get("engine") == "vllm"
    receiver = (
        "a vLLM engine (its worker process receives: raw runs there too, through collective_rpc, and "
        "rlcore's load is vLLM's checkpoint-format reload; CPU threads: vLLM's own)"
        if vllm
        else "the HF engine (1 CPU thread per process)"
    )
    lines = [
        f"gloo between two processes on one machine, {cfg['bucket_mb']} MiB buckets, {cfg['repeats']} "
        f"alternating repeats; the receiver is {receiver}. GB/s = model bytes / wall seconds of the "
        "whole sync, median over repeats. raw = rlcore's buckets broadcast from preallocated buffers; "
        f"raw packed = the same bytes in full {cfg['bucket_mb']} MiB buckets; reload = the receiving "
        "engine loading the model from its own memory (no wire).",
        "",
        "| model | params | MB | buckets | raw GB/s | raw packed GB/s | rlcore GB/s | checksums GB/s "
        "| in-process GB/s | reload GB/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in result["sizes"].items():
        if s.get("skipped"):
            lines.append(f"| {name} | skipped: {s['skipped']} |" + " |" * 8)
            continue
        cells = [f"{s['gb_per_s'][k]['median']:.3f}" if k in s["gb_per_s"] else "-" for k in SHOWN]
        lines.append(
            f"| {name} | {s['params'] / 1e6:.0f}M | {s['model_bytes'] / 1e6:.0f} | {s['num_buckets']} | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "Bandwidth / raw's bandwidth in the same repeat, min / median / max over the repeats; the last "
        "column is rlcore's against raw and reload one after the other (time of raw + time of reload "
        "over rlcore's: above 1 when rlcore overlaps the wire with the load):",
        "",
        "| model | raw packed / raw | **rlcore / raw** | checksums / raw | in-process / raw | reload / raw "
        "| rlcore / (raw then reload) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in done.items():
        cells = []
        for key in [f"{k}_over_raw" for k in SHOWN[1:]] + ["rlcore_over_serial"]:
            r = s["ratios"].get(key)
            mid = (
                "-"
                if r is None
                else f"**{r['median']:.2f}**"
                if key == "rlcore_over_raw"
                else f"{r['median']:.2f}"
            )
            cells.append("-" if r is None else f"{r['min']:.2f} / {mid} / {r['max']:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Breakdown, median seconds. Sender: gather = waiting for `iter_full_weights`, pack = copying "
        "into buckets (and CRC), send = blocked in the group; receiver: receive = blocked in the "
        "group, load = the rest (`load_weights` copies; with checksums also the CRC check"
        + ("; vLLM: its reload, and rpc = the collective_rpc round trip besides" if vllm else "")
        + "). In-process: "
        "gather, then copy in the load column. CPU = process CPU seconds (all threads); machine busy "
        f"cores = non-idle share of all {result['machine']['cpus']} cores during the run (/proc/stat: "
        "includes the kernel's softirq work for loopback TCP, and anyone else's load).",
        "",
        "| model | variant | wall | gather | pack | send | receive | load | "
        + ("rpc | " if vllm else "")
        + "sender CPU | receiver CPU | machine busy cores |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if vllm else ""),
    ]
    columns = (
        "sender_gather_s", "sender_pack_s", "sender_send_s", "receiver_receive_s", "receiver_load_s",
        *(("receiver_rpc_s",) if vllm else ()), "sender_cpu_s", "receiver_cpu_s", "sender_machine_busy_cores",
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
        f"{name}: "
        + ", ".join(
            f"{'sent' if side == 'sender' else 'received'} {share:.0%}"
            for side, share in s["uncopied_share"].items()
        )
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
        "Bytes rlcore moved without a copy (sent from the strategy's own tensor"
        + (", received into the engine's own parameter): " if not vllm else "; vLLM's reload copies all): ")
        + "; ".join(uncopied),
        "",
        f"Target rlcore / raw >= {TARGET_RATIO} (median): " + "; ".join(met),
        "",
        "Weights equal to the sender's after the runs (the targets start zeroed; "
        + (
            "vLLM: greedy tokens on fixed prompts equal to an HF model's with the sender's weights, "
            "log-probs within 1e-3; in-process: CRC-32 of every tensor"
            if vllm
            else "CRC-32 of every tensor"
        )
        + "): "
        + "; ".join(same),
    ]
    return "\n".join(lines)
