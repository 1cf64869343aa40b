"""Per-request saspec options through vLLM's OpenAI server, by hand in the vLLM venv after `saspec models install`:

    PYTHONPATH=src:bench/src /work/venvs/vllm/bin/python benchmarks/vllm/served_options.py

Starts the server (the 0.5B, fp32, saspec's proposer_config) and sends a completion request plain, with
`vllm_xargs` `saspec_enabled: 0` (the server's draft-token counter must not move, the text must not change), with
a bad option (HTTP 400 naming it) and with `saspec_max_draft_tokens: 2`; prints what it saw as JSON."""
import json, os, subprocess, sys, time, urllib.request, urllib.error

MODEL = os.path.expanduser("~/.cache/saspec/models/qwen2.5-coder-0.5b-instruct/bf16")
PORT = 8765
spec = json.dumps({"method": "custom_class", "model": "saspec.integrations.vllm.SAProposer", "num_speculative_tokens": 32})
env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
srv = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--dtype", "float32",
                        "--port", str(PORT), "--host", "127.0.0.1", "--max-num-seqs", "2", "--max-model-len", "2048",
                        "--enforce-eager", "--speculative-config", spec], env=env,
                       stdout=open(os.environ.get("SERVER_LOG", os.devnull), "w"), stderr=subprocess.STDOUT)

def post(body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def drafted():
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:spec_decode_num_draft_tokens_total"):
                return float(line.split()[-1])
    return 0.0

try:
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5)
            break
        except Exception:
            time.sleep(2)
            if srv.poll() is not None:
                raise SystemExit("server died")
    code = "def add(a, b):\n    return a + b\n\n" * 6 + "# rewrite the function above with type hints:\n"
    base = {"model": MODEL, "prompt": code, "max_tokens": 96, "temperature": 0}
    s0, plain = post({**base})
    d0 = drafted()
    s1, off = post({**base, "vllm_xargs": {"saspec_enabled": 0}})
    d1 = drafted()
    s2, bad = post({**base, "vllm_xargs": {"saspec_max_draft_tokens": -1}})
    s3, cap = post({**base, "vllm_xargs": {"saspec_max_draft_tokens": 2}})
    d3 = drafted()
    print(json.dumps({"default": s0, "drafted_default": d0, "off": s1, "drafted_by_off": d1 - d0,
                      "same_text": off["choices"][0]["text"] == plain["choices"][0]["text"],
                      "bad": s2, "bad_body": str(bad)[:300], "cap": s3, "drafted_by_cap": d3 - d1,
                      "cap_same_text": cap["choices"][0]["text"] == plain["choices"][0]["text"]}, indent=1))
finally:
    srv.terminate()
    srv.wait(60)
