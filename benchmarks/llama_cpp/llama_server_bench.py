"""llama.cpp's own C++ drafters through ``llama-server`` on the prompts of ``saspec bench-llama-cpp``.

Build ``llama-server`` from the llama.cpp that llama-cpp-python 0.3.36 vendors, outside the
repository (same default CPU flags as the pip build; about 10 minutes on 2 shared cores)::

    pip download llama-cpp-python==0.3.36 --no-deps --no-binary :all: -d /tmp/lcp && tar xzf ... -C /tmp/lcp
    cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/lcs-build -DCMAKE_BUILD_TYPE=Release \\
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    cmake --build /tmp/lcs-build --target llama-server -j 2

then, under the CPU lock, with the bench's prompts and plain outputs (``results.json`` of a
``bench-llama-cpp`` run with ``plain``)::

    PYTHONPATH=src:bench/src python benchmarks/llama_cpp/llama_server_bench.py /tmp/lcs-build/bin/llama-server \\
        benchmarks/llama_cpp/run1 --types none,ngram-mod,ngram-map-k,ngram-cache,ngram-simple,draft

Each spec type gets its own server (2 threads, n_ctx 8192, one slot); every prompt is sent as
token ids to ``/completion`` (temperature 0, ``cache_prompt`` false, ``return_tokens``), after an
untimed warm-up; wall time is measured by the client. Results: ``llama_server.json`` and
``llama_server.md`` in the run's directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from saspec_bench import models
from saspec_bench.prompts import bench_prompts
from saspec_bench.tokenizers import get_tokenizer

PORT = 8471


def post(path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def wait_up(proc: subprocess.Popen, limit_s: float = 120.0) -> None:
    t0 = time.time()
    while time.time() - t0 < limit_s:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not come up")


def main() -> int:
    server, run_dir = sys.argv[1], Path(sys.argv[2])
    types = sys.argv[sys.argv.index("--types") + 1].split(",") if "--types" in sys.argv else ["none", "ngram-mod"]
    res = json.loads((run_dir / "results.json").read_text())
    info = res["info"]
    argv = info["argv"]

    def opt(name: str, default: int) -> int:
        return int(argv[argv.index(name) + 1]) if name in argv else default

    prompts = bench_prompts(get_tokenizer(), opt("--code-prompts", 2), opt("--free-prompts", 1), opt("--seed", 0),
                            opt("--multi-turn-prompts", 2))
    plain = {r["id"]: r["tokens"] for r in res["runs"] if r["method"] == "plain"}
    target, draft = models.family("qwen2.5-coder")
    rows = []
    for kind in types:
        cmd = [server, "-m", str(models.gguf_path(target)), "--threads", str(info["threads"]), "--threads-batch",
               str(info["threads"]), "-c", str(info["n_ctx"]), "-np", "1", "--port", str(PORT), "--no-webui"]
        if kind == "draft":
            cmd += ["--spec-type", "draft-simple", "--spec-draft-model", str(models.gguf_path(draft)), "--spec-draft-threads", str(info["threads"]),
                    "--spec-draft-n-max", str(info["neural_k"]), "--spec-draft-p-min", str(info["p_min"])]
        elif kind != "none":
            cmd += ["--spec-type", kind]
        log = open(run_dir / f"llama-server-{kind}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_up(proc)
            post("/completion", {"prompt": prompts[0]["prompt_ids"][:64], "n_predict": 4, "temperature": 0,
                                 "cache_prompt": False})
            for p in prompts:
                max_new = info.get("free_max_new", 200) if p["kind"] == "free-form" else 300
                max_new = len(plain.get(p["id"], [])) or max_new
                t0 = time.perf_counter()
                r = post("/completion", {"prompt": p["prompt_ids"], "n_predict": max_new, "temperature": 0,
                                         "cache_prompt": False, "return_tokens": True})
                wall = time.perf_counter() - t0
                toks = r.get("tokens", [])
                t = r.get("timings", {})
                ref = plain.get(p["id"])
                rows.append({"type": kind, "id": p["id"], "kind": p["kind"], "tokens": len(toks), "wall_s": wall,
                             "tok_per_s": len(toks) / wall, "draft_n": t.get("draft_n", 0),
                             "draft_n_accepted": t.get("draft_n_accepted", 0), "prompt_ms": t.get("prompt_ms"),
                             "predicted_ms": t.get("predicted_ms"),
                             "same_as_plain": None if ref is None else toks == ref[: len(toks)] and len(toks) == len(ref),
                             "out": toks})
                print(kind, p["id"], len(toks), f"{wall:.2f}s", rows[-1]["same_as_plain"], flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()
    (run_dir / "llama_server.json").write_text(json.dumps(rows, indent=1))
    lines = ["| kind | spec type | tokens | tok/s | accepted / drafted | identical to plain (llama-cpp-python) |",
             "|---|---|---:|---:|---:|---:|"]
    for kind in sorted({r["kind"] for r in rows}):
        for ty in types:
            rs = [r for r in rows if r["kind"] == kind and r["type"] == ty]
            if rs:
                n = sum(r["tokens"] for r in rs)
                lines.append(f"| {kind} | {ty} | {n} | {n / sum(r['wall_s'] for r in rs):.2f} | "
                             f"{sum(r['draft_n_accepted'] for r in rs)} / {sum(r['draft_n'] for r in rs)} | "
                             f"{sum(bool(r['same_as_plain']) for r in rs)}/{len(rs)} |")
    (run_dir / "llama_server.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
