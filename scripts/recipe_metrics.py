"""Run recipes and keep their metrics, to show that a refactor changes no number.

    python scripts/recipe_metrics.py run --out /tmp/before.json [--short] [recipe ...]
    python scripts/recipe_metrics.py compare /tmp/before.json /tmp/after.json

`run` launches each recipe (default: every one in configs/ but those that need a service of their
own) in a fresh checkpoint folder and keeps every record of every metrics.jsonl the run wrote,
less what depends on the machine's speed (perf/*, memory/*, *_s, time, timestamp). `--short`
trains each stage a few steps (SFT stages 20, the others 5), which is enough to cover every code
path of a recipe in a few minutes.

`compare` says, per recipe, whether the two files hold the same records, and where they first
differ. Runs whose schedule depends on timing (asynchronous both, the long-tail scheduler) are
compared on their final evaluation and step counts only: their records differ run to run.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = ("adaptive_teaching.yaml", "on_policy_distill.yaml", "judge.yaml", "tinker.yaml")
"""adaptive_teaching needs an OpenAI-compatible student service of its own, judge a judge service,
tinker a Tinker service; on_policy_distill the quickstart's trained model as its teacher."""
TIMING = (
    "asynchronous.yaml", "replay.yaml", "long_tails.yaml", "decoupled.yaml", "dpo_explored.yaml", "partial_rollout.yaml",
)
"""Recipes whose records depend on timing (which step an experience lands in, which published
version an explorer loads)."""
TWO_LAUNCHES = ("decoupled.yaml", "dpo_explored.yaml")
"""Recipes run as a mode-train launch beside a mode-explore one."""


def speed_key(key: str) -> bool:
    head = key.split("/", 1)[0]
    return head in ("perf", "memory") or key.endswith("_s") or key in ("time", "timestamp", "_timestamp")


def recipes(names: list[str]) -> list[str]:
    found = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
    found += sorted(glob.glob(os.path.join(ROOT, "configs", "algorithms", "*.yaml")))
    if names:
        return [p for p in found if os.path.relpath(p, ROOT) in names or os.path.basename(p) in names]
    return [p for p in found if os.path.basename(p) not in SKIP]


def short_overrides(path: str) -> list[str]:
    from rlcore.core.config import load_config

    cfg = load_config(path, [])
    out = []
    for i, stage in enumerate(cfg.stages or [None]):
        algo = stage.get("algorithm", {}).get("algorithm_type") if stage is not None else None
        steps = 20 if algo == "sft" else 5
        prefix = f"stages.{i}." if stage is not None else ""
        out.append(f"{prefix}buffer.total_steps={steps}")
    return out


def launch(path: str, root: str, extra: list[str]) -> tuple[int, float, str]:
    base = [sys.executable, "-m", "rlcore.cli", "launch", path, f"checkpoint_root_dir={root}", *extra]
    start = time.time()
    log = os.path.join(root, "launch.log")
    os.makedirs(root, exist_ok=True)
    with open(log, "w") as out:
        if os.path.basename(path) in TWO_LAUNCHES:
            trainer = subprocess.Popen(base, stdout=out, stderr=subprocess.STDOUT)
            explorer = subprocess.run([*base, "mode=explore"], stdout=out, stderr=subprocess.STDOUT)
            rc = trainer.wait() or explorer.returncode
        else:
            rc = subprocess.run(base, stdout=out, stderr=subprocess.STDOUT).returncode
    return rc, time.time() - start, log


def records(root: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(root, "**", "metrics.jsonl"), recursive=True)):
        rows = []
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                rows.append({k: v for k, v in row.items() if not speed_key(k)})
        out[os.path.relpath(path, root)] = rows
    return out


def run(args: argparse.Namespace) -> int:
    result: dict[str, dict] = {}
    for path in recipes(args.recipes):
        name = os.path.relpath(path, ROOT)
        extra = short_overrides(path) if args.short else []
        with tempfile.TemporaryDirectory(prefix="rlcore-metrics-") as root:
            rc, seconds, log = launch(path, root, extra)
            entry = {"rc": rc, "seconds": round(seconds, 1), "overrides": extra, "metrics": records(root)}
            if rc != 0:
                with open(log) as f:
                    entry["log_tail"] = f.read()[-3000:]
        result[name] = entry
        print(f"{name}: rc {rc}, {seconds:.0f} s, {sum(len(v) for v in entry['metrics'].values())} records", flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def final_eval(metrics: dict[str, list[dict]]) -> dict[str, object]:
    out = {}
    for file, rows in metrics.items():
        evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
        out[file] = ({k: v for k, v in evals[-1].items() if k.startswith("eval/")} if evals else {}, len(rows))
    return out


def first_difference(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> str | None:
    if sorted(a) != sorted(b):
        return f"files differ: {sorted(a)} vs {sorted(b)}"
    for file in a:
        if len(a[file]) != len(b[file]):
            return f"{file}: {len(a[file])} vs {len(b[file])} records"
        for i, (ra, rb) in enumerate(zip(a[file], b[file], strict=True)):
            for key in sorted(set(ra) | set(rb)):
                if not same(ra.get(key), rb.get(key)):
                    return f"{file} record {i}: {key} {ra.get(key)!r} vs {rb.get(key)!r}"
    return None


def compare(args: argparse.Namespace) -> int:
    with open(args.before) as f:
        before = json.load(f)
    with open(args.after) as f:
        after = json.load(f)
    bad = 0
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            print(f"{name}: only in {'before' if name in before else 'after'}")
            bad += 1
            continue
        a, b = before[name], after[name]
        if a["rc"] != 0 or b["rc"] != 0:
            print(f"{name}: exit codes {a['rc']} and {b['rc']}")
            bad += 1
            continue
        count = sum(len(v) for v in a["metrics"].values())
        if os.path.basename(name) in TIMING:
            ea, eb = final_eval(a["metrics"]), final_eval(b["metrics"])
            print(f"{name}: timing-dependent; final evaluation and record counts {'equal' if ea == eb else 'differ'}: "
                  f"{ea} vs {eb}")
            continue
        diff = first_difference(a["metrics"], b["metrics"])
        print(f"{name}: " + (f"identical ({count} records)" if diff is None else f"DIFFERENT: {diff}"))
        bad += diff is not None
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run recipes and keep their metrics")
    r.add_argument("--out", required=True)
    r.add_argument("--short", action="store_true", help="train each stage a few steps")
    r.add_argument("recipes", nargs="*", help="configs/... paths or file names (default: all)")
    c = sub.add_parser("compare", help="compare two files of kept metrics")
    c.add_argument("before")
    c.add_argument("after")
    args = parser.parse_args()
    return run(args) if args.command == "run" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
