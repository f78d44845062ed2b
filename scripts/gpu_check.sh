#!/usr/bin/env bash
# One command for a GPU machine without internet: install rlcore (from a folder of wheels when given
# one: scripts/download_wheels.sh fills it on a machine with internet), then run these parts:
#   engine      the HF engine's CUDA-graph decode against its eager loop (tests/gpu/test_hf_engine_cuda.py)
#   decode      rlcore bench decode: the CUDA-graph loop's tokens/s at --model, 8 prompts x 8 x 96 tokens,
#               one call under torch's profiler (decode_profile.md, its Chrome trace beside it)
#   bench_trl   rlcore bench trl: the GRPO step against TRL's on CUDA at --model (default 0.5b), --repeats
#               alternating repeats of rlcore and each TRL configuration (--trl-configs; default the
#               fastest fair ones, bf16 and bf16-cb, then as-shipped); its report gives each side's
#               rollout tokens/s and the update's MFU
#   bench_lora  rlcore bench lora: LoRA and offloading (fsdp2's CPUOffloadPolicy) against full
#               fine-tuning, CUDA peak memory and step time
#   bench_packing  rlcore bench packing: packed against padded micro-batches on a long tail (most
#               responses 32-128 tokens, 1 in 12 of 4-8k), train tokens/s and CUDA peak memory
#   throughput  rlcore bench throughput (rollout tokens/s of the HF engine, its running batch as a
#               worker calls it, its eager loop and model.generate; greedy agreement of the first and
#               the eager loop) at --model; not in the default parts (bench trl reports the rollout speeds)
#   door        rlcore bench door on CUDA (bf16, the scratch model): 8 requests with their own seeds
#               and max_tokens against one n=8 request (continuous batching in CUDA graphs), time to
#               first streamed token, a short request inside a long one; not in the default parts
#   tests       the rest of tests/gpu (--tests-k EXPR: only those pytest -k selects)
#   quickstarts the quickstart on CUDA with megatron (rollout worker on the same GPU, checkpoint sync)
#               and with fsdp2 (stage rl colocated), bf16
#   qwen3_moe   configs/qwen3_moe.yaml on CUDA with megatron (megatron-core's MoE layer without
#               TransformerEngine, the HF engine decoding Qwen3-MoE in CUDA graphs), bf16, its SFT
#               stage cut to 300 steps (megatron took 0.22 s per tiny step on an H200: 1000 steps
#               did not leave the GRPO stage room in a 190 s part)
# (bench = decode,bench_trl,bench_lora,bench_packing.) The engine check and the benchmarks run one at a time; the tests and
# the two quickstarts (tiny models) then run side by side.
# Writes benchmarks/results/gpu/*.md|json|png and a summary (gpu_check.md: versions, each part's
# result and minutes, the quickstarts' accuracies). With $OUT set (or --out DIR) the results and logs
# are packed into DIR/gpu_check.tar.gz after every part (one file: a machine that hands back a few
# files only still returns all of it), so a run stopped from outside still leaves what it finished.
#
#   bash scripts/gpu_check.sh [--wheels DIR] [--parts engine,bench,tests,quickstarts] [--model 0.5b]
#                             [--repeats N] [--trl-configs LIST] [--tests-k EXPR] [--out DIR]
# --repeats (default 1) sets the benchmarks' repeats (bench trl: repeats of every side). The default
# invocation is sized to finish in about 10 minutes on one H200 (the parts' times of 2026-11-30:
# engine 0.4, decode 0.5, bench packing 1.6, bench lora about 1, bench trl 2.9 minutes one after
# the other, then the tests, the quickstarts and qwen3_moe side by side, about 3); headline numbers
# want --repeats 3.
#
# Exit status: 0 when every part passed, 1 otherwise (each part runs even when an earlier one failed).
# PART_TIMEOUT_S (default 1800) bounds each part, TIMEOUT_<part> (TIMEOUT_bench_trl=300) one part: a
# part that runs longer is stopped and counts as failed.
set -uo pipefail
cd "$(dirname "$0")/.."

wheels="" parts="engine,bench,tests,quickstarts,qwen3_moe" model="0.5b" out="${OUT:-}" tests_k="" repeats=1 trl_configs=""
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="$2"; shift 2 ;;
    --parts) parts="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --tests-k) tests_k="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --trl-configs) trl_configs="$2"; shift 2 ;;
    -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (allowed: --wheels DIR, --parts LIST, --model NAME, --repeats N, --trl-configs LIST, --tests-k EXPR, --out DIR)" >&2; exit 2 ;;
  esac
done
parts=${parts//bench,/decode,bench_packing,bench_lora,bench_trl,}
[[ "$parts" == *,bench || "$parts" == bench ]] && parts="${parts%bench}decode,bench_packing,bench_lora,bench_trl"
for part in ${parts//,/ }; do
  case "$part" in engine|decode|bench_trl|bench_lora|bench_packing|throughput|door|tests|quickstarts|qwen3_moe) ;; *)
    echo "gpu_check.sh: --parts takes engine, bench (decode,bench_packing,bench_lora,bench_trl), throughput, door, tests, quickstarts, qwen3_moe; got '$part'" >&2
    exit 2 ;;
  esac
done

results=benchmarks/results/gpu
scratch=$(mktemp -d /tmp/rlcore-gpu-check.XXXXXX)  # the logs, and the quickstarts' run folders
logs="$scratch/logs"
mkdir -p "$results" "$logs"
pack() {  # the results and logs so far into $out/gpu_check.tar.gz (replaced whole)
  [ -n "$out" ] || return 0
  mkdir -p "$out"
  local part="$out/.gpu_check.$BASHPID.tar.gz"  # parts running side by side pack at once
  tar -czf "$part" "$results" -C "$scratch" logs 2>/dev/null && mv "$part" "$out/gpu_check.tar.gz"
}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

# ---------------------------------------------------------------- install
if [ -n "$wheels" ]; then
  site=/tmp/rlcore-site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl \
    || { echo "gpu_check: installing the wheels of $wheels failed"; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! python3 -c "import rlcore.cli.main" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$logs/install.log" 2>&1 \
    || { echo "gpu_check: pip install -e . failed; see $logs/install.log"; tail -20 "$logs/install.log"; exit 1; }
fi
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'" \
  || { echo "gpu_check: needs a CUDA GPU"; exit 1; }

summary="$results/gpu_check.md"
{
  echo "# scripts/gpu_check.sh on $(date -u +%Y-%m-%d)"
  echo
  python3 - <<'EOF'
import platform
from importlib.metadata import version, PackageNotFoundError
import torch
props = torch.cuda.get_device_properties(0)
print(f"- GPU: {torch.cuda.get_device_name(0)} ({props.total_memory / 2**30:.0f} GiB), "
      f"{torch.cuda.device_count()} visible; CUDA {torch.version.cuda}")
found = []
for name in ("torch", "transformers", "megatron-core", "trl", "peft", "grpcio", "protobuf", "omegaconf", "datasets"):
    try:
        found.append(f"{name} {version(name)}")
    except PackageNotFoundError:
        found.append(f"{name} absent")
print(f"- Python {platform.python_version()}; " + ", ".join(found))
EOF
  echo "- parts: $parts; benchmark model: $model"
  echo
  echo "| part | result | minutes |"
  echo "|---|---|---:|"
} > "$summary"

run_part() {  # name, command...: runs it with its log in $logs/<name>.log, its exit status and minutes beside
  local name="$1"; shift
  echo "gpu_check: $name ..."
  local t0=$SECONDS limit="TIMEOUT_$name"
  timeout -k 10 "${!limit:-${PART_TIMEOUT_S:-1800}}" "$@" > "$logs/$name.log" 2>&1
  echo "$? $(( SECONDS - t0 ))" > "$logs/$name.rc"
  echo "gpu_check: $name done (exit $(cut -d' ' -f1 "$logs/$name.rc"), $(( SECONDS - t0 )) s)"
  pack
}

want() { [[ ",$parts," == *",$1,"* ]]; }
names=()

# timed work runs alone on the machine ...
if want engine; then
  names+=(engine)
  run_part engine python3 -m pytest -q -p no:cacheprovider tests/gpu/test_hf_engine_cuda.py
fi
if want decode; then
  names+=(decode)
  run_part decode python3 -m rlcore.cli bench decode --device cuda --model "$model" --prompts 8 --n 8 \
    --max-tokens 96 --calls 3 --out "$results/decode_profile.json"
fi
if want throughput; then
  names+=(throughput)
  run_part throughput python3 -m rlcore.cli bench throughput --device cuda --model "$model" \
    --engines hf,hf-batch,hf-eager,hf-generate --strategies '' --prompts 8 --n 8 --max-tokens 96 \
    --calls 2 --repeats 1 --out "$results/throughput.json"
fi
if want door; then
  names+=(door)
  run_part door python3 -m rlcore.cli bench door --device cuda --dtype bfloat16 --concurrency 8 \
    --max-tokens 48 --repeats "$(( repeats > 3 ? repeats : 3 ))" --out "$results/door.json"
fi
if want bench_lora; then
  names+=(bench_lora)
  run_part bench_lora python3 -m rlcore.cli bench lora --device cuda --model "$model" --repeats "$repeats" --steps 3 \
    --sides full,lora,offload --out "$results/lora.json"
fi
if want bench_packing; then
  names+=(bench_packing)
  run_part bench_packing python3 -m rlcore.cli bench packing --device cuda --model "$model" --repeats "$repeats" \
    --long 4096,8192 --max-tokens 32768 --out "$results/packing.json"
fi
if want bench_trl; then
  names+=(bench_trl)
  run_part bench_trl python3 -m rlcore.cli bench trl --device cuda --model "$model" --comparisons same_engine \
    --prompts 8 --group 8 --max-tokens 96 --steps 3 --repeats "$repeats" ${trl_configs:+--trl-configs "$trl_configs"} \
    --run-timeout 240 --out "$results/vs_trl.json"
fi
# ... the functional checks side by side (tiny models: the GPU has room for all three)
if want tests; then
  names+=(tests)
  run_part tests python3 -m pytest -v -p no:cacheprovider tests/gpu ${tests_k:+-k "$tests_k"} \
    --deselect tests/gpu/test_hf_engine_cuda.py \
    --deselect tests/gpu/test_strategy_parity_cuda.py::test_quickstart_trains_with_megatron_on_cuda &
fi
if want quickstarts; then
  names+=(quickstart_megatron quickstart_fsdp2)
  RLCORE_CHECKPOINT_DIR="$scratch/qs-megatron" run_part quickstart_megatron python3 -m rlcore.cli launch \
    --strategy megatron configs/quickstart.yaml cluster.device=cuda model.dtype=bfloat16 \
    synchronizer.sync_method=checkpoint &
  RLCORE_CHECKPOINT_DIR="$scratch/qs-fsdp2" run_part quickstart_fsdp2 python3 -m rlcore.cli launch \
    --strategy fsdp2 configs/quickstart.yaml cluster.device=cuda model.dtype=bfloat16 stages.1.mode=colocate &
fi
if want qwen3_moe; then
  names+=(qwen3_moe)
  RLCORE_CHECKPOINT_DIR="$scratch/qwen3-moe" run_part qwen3_moe python3 -m rlcore.cli launch \
    --strategy megatron configs/qwen3_moe.yaml cluster.device=cuda model.dtype=bfloat16 \
    synchronizer.sync_method=checkpoint stages.0.buffer.total_steps=300 &
fi
wait

status=0
for name in "${names[@]}"; do
  read -r rc seconds < "$logs/$name.rc"
  result="passed"
  [ "$rc" -eq 0 ] || { result="FAILED (exit $rc)"; status=1; }
  counts=$(grep -E "[0-9]+ (passed|failed|skipped)" "$logs/$name.log" | tail -1)
  echo "| $name | $result${counts:+: $counts} | $(python3 -c "print(f'{$seconds / 60:.1f}')") |" >> "$summary"
  [ "$rc" -eq 0 ] || { echo "gpu_check: $name FAILED; the end of its log:"; tail -25 "$logs/$name.log"; }
done

library=' (INFO|WARNING|DEBUG) (megatron|torch|transformers)'
if want quickstarts || want qwen3_moe; then
  {
    echo
    echo "Quickstarts (\`rlcore launch --strategy S configs/quickstart.yaml cluster.device=cuda model.dtype=bfloat16\`"
    echo "plus \`synchronizer.sync_method=checkpoint\` for megatron, \`stages.1.mode=colocate\` for fsdp2):"
    for run in quickstart_megatron:qs-megatron quickstart_fsdp2:qs-fsdp2 qwen3_moe:qwen3-moe; do
      name=${run%%:*} dir=${run##*:}
      [ -f "$logs/$name.log" ] || continue
      echo
      echo "- $name:"
      grep -E "rlcore: finished|after stage" "$logs/$name.log" | sed 's/^/    /'
      trainer_log=$(find "$scratch/$dir" -name trainer.log | head -1)
      [ -n "$trainer_log" ] && cp "$trainer_log" "$logs/$name.trainer.log"
      echo "    library log records on stdout: $(grep -c -E "$library" "$logs/$name.log" || true)," \
        "in launch/trainer.log: $(grep -c -E "$library" "${trainer_log:-/dev/null}" || true)"
    done
  } >> "$summary"
fi

for f in decode_profile vs_trl throughput lora packing door; do
  want "${f/vs_trl/bench_trl}" || want "${f/lora/bench_lora}" || want "${f/packing/bench_packing}" \
    || want "${f/decode_profile/decode}" || continue
  [ -f "$results/$f.md" ] && { echo; echo "## $f"; echo; cat "$results/$f.md"; } >> "$summary"
done
cat "$summary"
pack && [ -n "$out" ] && echo "gpu_check: results and logs in $out/gpu_check.tar.gz"
exit "$status"
