#!/usr/bin/env bash
# Fill a folder with the wheels an offline GPU machine lacks, for its Python and platform, so that
# `scripts/gpu_check.sh --wheels DIR` can install rlcore there without the internet.
#
#   bash scripts/download_wheels.sh [DIR] [--python 3.12] [--only-binary]
#
# The default list is what a lent H100 machine (Python 3.12, torch 2.11+cu130, transformers 5.17,
# peft 0.21, numpy, pandas, pyarrow, xxhash, psutil, accelerate preinstalled) was missing when it was
# first used here; each is pinned to the version the CPU suite runs with. Add more with EXTRA="name==v ...".
# torch, transformers and the CUDA stack are never downloaded: the GPU machine's own are the ones to test.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=.whl
python_version=3.12
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python_version="$2"; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "download_wheels.sh: unknown option $1 (allowed: --python X.Y)" >&2; exit 2 ;;
    *) dir="$1"; shift ;;
  esac
done

packages=(
  omegaconf==2.4.0
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
  grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.2
  megatron-core==0.16.1
  trl==1.16.0
)
# shellcheck disable=SC2206
packages+=(${EXTRA:-})

mkdir -p "$dir"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  "${platforms[@]}" -d "$dir" "${packages[@]}"
count=$(ls "$dir"/*.whl | wc -l)
size=$(du -sh "$dir" | cut -f1)
echo "download_wheels: $count wheels ($size) in $dir for Python $python_version, manylinux x86_64"
