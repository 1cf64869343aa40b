#!/usr/bin/env python3
"""GPU check of the CUDA backend: one H200, under 5 minutes, no arguments.

    python3 benchmarks/gpu_check.py        # from the repository root or anywhere

Sections (each runs even if an earlier one failed; its error is recorded):

1. tests     pytest tests/library/test_cuda.py tests/library/test_engine.py on the real device (the cross-request pool included)
             (SASPEC_TEST_CUDA=device: torch CUDA tensors, graph capture).
2. graph     extend + select_drafts captured in one torch.cuda.graph and replayed
             for many steps, the batch re-prepared (permuted, then shrunk) between
             replays; every step's outputs compared with the CPU backend.
3. extend    time per extend call, batch 1 / 64 / 256, 3 accepted tokens per row,
             K=8: CUDA events around graph replays of 16 calls (target: <= 10 us
             per call at batch 256), one call per graph, and eager calls.
4. threads   extend time per call vs threads per block (1 to 128) at batch 64 /
             256 / 1024, in interleaved rounds: rows take different branches
             through their automata, so rows that share a warp wait for each
             other; the engine's default (TorchDevice.extend_threads) should be
             the fastest.
5. tokens    where the time of a call goes: extend per call (16 calls in one
             graph) with 0, 1, 3 and 9 accepted tokens per row, at batch 1 and
             256, next to a graph of 16 one-element torch fills (the floor of a
             graph node). 0 tokens is the match and the K drafts alone.
6. overhead  a decode-step loop (a stand-in model: matmuls and an argmax) with
             the SA disabled (threshold=inf), enabled, and absent altogether,
             each captured as a CUDA graph and run eagerly.
7. prepare   upload of a 32k-token prompt into a fresh and into a reused slot.
8. drafter   the whole device drafting step (saspec.device.drafter.DeviceDrafter: extend, the offers, the
             policy's decision, the cut; K=8, 3 accepted tokens per row) captured in one CUDA graph of 16
             steps, us per step at batch 64 and 256 (goal <= 10 us at 256); and
             tests/library/test_device_drafter.py on the device (device step == host Drafter step).
9. curves    benchmarks/gpu_step_curves.py: step-cost curves of the Qwen2.5-Coder 1.5B and 7B architectures
             (random weights, bf16, batches 1-64 x 1-33 tokens a row after 1k cached, CUDA graphs), written
             to $OUT/curves/ as curve files for saspec_bench.served_sim --curve (the replay runs where vLLM is).

Prints a table and writes $OUT/gpu_check.json (and the pytest log) when OUT is
set. Exit status: 0 all good; 1 something failed or mismatched (printed loudly);
2 no usable GPU.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.pop("NUMBA_ENABLE_CUDASIM", None)  # before anything imports numba.cuda

K = 8
ACCEPTED = 3
TARGET_US_AT_256 = 10.0
TESTS_TIMEOUT_S = 240
CURVES_TIMEOUT_S = 150
OUT = os.environ.get("OUT")

RESULTS: dict[str, Any] = {"sections": {}, "errors": [], "mismatches": []}


def say(msg: str = "") -> None:
    print(msg, flush=True)


def fail(section: str, msg: str) -> None:
    """Record a correctness failure (the check goes on)."""
    RESULTS["mismatches"].append({"section": section, "what": msg})
    say(f"!!! MISMATCH in {section}: {msg}")


def run_section(name: str, fn: Callable[[], dict]) -> None:
    say(f"\n=== {name} ===")
    t0 = time.perf_counter()
    try:
        out = fn()
        out["wall_s"] = round(time.perf_counter() - t0, 1)
        RESULTS["sections"][name] = out
        say(f"--- {name}: done in {out['wall_s']} s")
    except Exception:
        tb = traceback.format_exc()
        RESULTS["errors"].append({"section": name, "traceback": tb})
        RESULTS["sections"][name] = {"error": tb.strip().splitlines()[-1], "wall_s": round(time.perf_counter() - t0, 1)}
        say(f"!!! SECTION {name} FAILED:\n{tb}")


# -- workload ------------------------------------------------------------------


def make_streams(n_req: int, length: int, rng: np.random.Generator, vocab: int = 32000) -> np.ndarray:
    """int32 [n_req, length]: per request, text that repeats itself with edits
    (blocks of 20-200 tokens, each used 1-4 times, 0-2 tokens changed per copy),
    like code edits or agent traces, so the automaton finds long matches."""
    out = np.empty((n_req, length), np.int32)
    for r in range(n_req):
        parts, total = [], 0
        while total < length:
            block = rng.integers(0, vocab, int(rng.integers(20, 200)))
            for _ in range(int(rng.integers(1, 5))):
                copy = block.copy()
                where = rng.integers(0, len(copy), int(rng.integers(0, 3)))
                copy[where] = rng.integers(0, vocab, len(where))
                parts.append(copy)
                total += len(copy)
        out[r] = np.concatenate(parts)[:length]
    return out


def take(streams: np.ndarray, rows: list[int], pos: np.ndarray, lens: np.ndarray, width: int) -> np.ndarray:
    """int32 [len(rows), width]: each row's next lens[b] stream tokens (advancing pos)."""
    acc = np.zeros((len(rows), width), np.int32)
    for b, r in enumerate(rows):
        n = int(lens[b])
        acc[b, :n] = streams[r, pos[r] : pos[r] + n]
        pos[r] += n
    return acc


def new_engines(streams: np.ndarray, prompt_len: int, max_seq_len: int, with_cpu: bool = True):
    from saspec import SpecEngine

    gpu = SpecEngine(backend="cuda", max_slots=streams.shape[0], max_seq_len=max_seq_len)
    cpu = SpecEngine() if with_cpu else None
    for r in range(streams.shape[0]):
        gpu.add_request(r, streams[r, :prompt_len])
        if cpu is not None:
            cpu.add_request(r, streams[r, :prompt_len])
    return gpu, cpu


def device_tensors(torch, b: int, k: int = K):
    """Static step tensors: accepted [b, k+1], lens [b], match [b], drafts [b, k]."""
    z = dict(dtype=torch.int32, device="cuda")
    return torch.zeros((b, k + 1), **z), torch.zeros(b, **z), torch.zeros(b, **z), torch.zeros((b, k), **z)


def warm_up(torch, gpu, *tensors) -> None:
    """Compile and load the kernels outside any capture, on a side stream
    (as torch recommends before capturing); lens = 0 changes no automaton."""
    acc, lens, mout, dout = tensors
    zero = torch.zeros_like(lens)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            gpu.extend(acc, zero, mout, dout)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def group_graph(torch, gpu, streams, rows, pos, n, tensors, group: int, chunks: int):
    """A CUDA graph of ``group`` extend calls on ``tensors`` = (acc_all [group, B, K+1],
    lens, mout, dout), and ``chunks`` replays' worth of the rows' next stream
    tokens for it ([chunks, group, B, K+1] on the device, advancing pos)."""
    acc_all, lens, mout, dout = tensors
    tokens = np.stack([np.stack([take(streams, rows, pos, n, K + 1) for _ in range(group)]) for _ in range(chunks)])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for g in range(group):
            gpu.extend(acc_all[g], lens, mout, dout)
    return graph, torch.from_numpy(tokens).cuda()


# -- sections ----------------------------------------------------------------------


def section_env() -> dict:
    import numba
    import torch

    if not torch.cuda.is_available():
        return {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "gpu": None}
    from numba import cuda

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "numba": numba.__version__,
        "gpu": torch.cuda.get_device_name(),
        "capability": list(torch.cuda.get_device_capability()),
    }
    try:
        import numba_cuda

        env["numba_cuda"] = numba_cuda.__version__
    except Exception as e:  # noqa: BLE001
        env["numba_cuda"] = f"not importable: {e}"
    try:
        env["driver"] = list(cuda.cudadrv.driver.driver.get_version())
    except Exception as e:  # noqa: BLE001
        env["driver"] = f"unknown: {e}"
    for key, val in env.items():
        say(f"{key:>12}: {val}")
    return env


def device_test_env() -> dict:
    """The environment of a pytest run on the real device: SASPEC_TEST_CUDA=device, the repository's src first."""
    env = dict(os.environ, SASPEC_TEST_CUDA="device", PYTHONUNBUFFERED="1")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_logged(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int | str, str]:
    """Run ``cmd`` from the repository root: its exit status ("timeout" past ``timeout`` seconds) and its
    stdout and stderr (what it wrote before a timeout)."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        return "timeout", out.decode(errors="replace") if isinstance(out, bytes) else out


def section_tests() -> dict:
    env = device_test_env()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/library/test_cuda.py",
        "tests/library/test_engine.py",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
    ]
    say("$ SASPEC_TEST_CUDA=device " + " ".join(cmd[1:]))
    t0 = time.perf_counter()
    rc, log = run_logged(cmd, TESTS_TIMEOUT_S, env)
    if OUT:
        Path(OUT, "gpu_check_pytest.log").write_text(log)
    tail = "\n".join(log.strip().splitlines()[-25:])
    say(tail)
    if rc != 0:
        fail("tests", f"pytest exit status {rc}")
    summary = log.strip().splitlines()[-1] if log.strip() else ""
    return {"rc": rc, "summary": summary, "seconds": round(time.perf_counter() - t0, 1)}


def section_graph() -> dict:
    """Graph replays of extend + select_drafts against the CPU backend, step by step."""
    import torch

    from saspec.rules import select_drafts, select_drafts_np

    rng = np.random.default_rng(0)
    b, prompt, steps, thr = 256, 1500, 120, 4
    streams = make_streams(b, prompt + steps * (K + 1), rng)
    gpu, cpu = new_engines(streams, prompt, streams.shape[1])
    ids = list(range(b))
    gpu.prepare(ids)
    tensors = device_tensors(torch, b)
    acc, lens, mout, dout = tensors
    warm_up(torch, gpu, *tensors)
    neural_h = rng.integers(0, 32000, (b, K)).astype(np.int32)
    neural = torch.from_numpy(neural_h).cuda()
    threshold = torch.tensor(thr, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gpu.extend(acc, lens, mout, dout)
        drafts, use_sa = select_drafts(neural, dout, mout, threshold)

    # Batches: all rows, then a permutation, then half of another permutation.
    batches = [ids, [int(r) for r in rng.permutation(b)], [int(r) for r in rng.permutation(b)[: b // 2]]]
    batch_of_step = [batches[min(3 * s // steps, 2)] for s in range(steps)]
    pos = np.full(b, prompt, np.int64)
    acc_h, lens_h = [], []
    for rows in batch_of_step:
        n = rng.integers(0, K + 2, b).astype(np.int32)
        a = np.zeros((b, K + 1), np.int32)
        a[: len(rows)] = take(streams, rows, pos, n[: len(rows)], K + 1)
        a[len(rows) :] = rng.integers(0, 32000, (b - len(rows), K + 1))  # beyond the batch: ignored
        acc_h.append(a)
        lens_h.append(n)
    acc_all = torch.from_numpy(np.stack(acc_h)).pin_memory()
    lens_all = torch.from_numpy(np.stack(lens_h)).pin_memory()
    hist = {
        name: torch.empty((steps,) + tuple(t.shape), dtype=t.dtype, device="cuda")
        for name, t in (("m", mout), ("d", dout), ("s", drafts), ("u", use_sa))
    }
    current = None
    for s in range(steps):
        if batch_of_step[s] is not current:
            current = batch_of_step[s]
            gpu.prepare(current)  # host-side; the replay reads the new map on the device
        acc.copy_(acc_all[s], non_blocking=True)
        lens.copy_(lens_all[s], non_blocking=True)
        graph.replay()
        for name, t in (("m", mout), ("d", dout), ("s", drafts), ("u", use_sa)):
            hist[name][s].copy_(t)
    torch.cuda.synchronize()
    hist = {name: t.cpu().numpy() for name, t in hist.items()}

    bad, matched, used = 0, 0, 0
    for s, rows in enumerate(batch_of_step):
        nb = len(rows)
        cpu.prepare(rows)
        m, d = np.zeros(nb, np.int32), np.zeros((nb, K), np.int32)
        cpu.extend(acc_h[s][:nb].copy(), lens_h[s][:nb].copy(), m, d)
        gm, gd = hist["m"][s], hist["d"][s]
        ok = np.array_equal(gm[:nb], m) and np.array_equal(gd[:nb], d)
        ok = ok and (gm[nb:] == 0).all() and (gd[nb:] == -1).all()
        want_d, want_u = select_drafts_np(neural_h, gd, gm, thr)
        ok = ok and np.array_equal(hist["s"][s], want_d) and np.array_equal(hist["u"][s], want_u)
        if not ok:
            bad += 1
            if bad <= 3:
                diff = np.flatnonzero((gm[:nb] != m) | (gd[:nb] != d).any(1))
                if diff.size:
                    r = int(diff[0])
                    what = f"row {r}: gpu {gm[r]} {gd[r].tolist()}, cpu {m[r]} {d[r].tolist()}"
                else:
                    what = "rows beyond the batch not 0/-1, or select_drafts differs from select_drafts_np"
                fail("graph", f"step {s} (batch {nb}): {what}")
        matched += int((m > 0).sum())
        used += int(want_u.sum())
    rows_total = sum(len(r) for r in batch_of_step)
    out = {
        "batch": b,
        "steps": steps,
        "steps_mismatched": bad,
        "rows_with_match_pct": round(100 * matched / rows_total, 1),
        "rows_using_sa_pct": round(100 * used / rows_total, 1),
    }
    if matched == 0:
        fail("graph", "no row ever matched: the comparison is vacuous")
    say(json.dumps(out))
    return out


def replay_us(torch, graph, n_calls: int, static, chunks, warm: int) -> tuple[float, float]:
    """(median, min) microseconds per captured call over replays of ``graph``,
    timed with CUDA events; before each replay (outside the timed span) the
    static input gets that replay's tokens, ``chunks[i]``; the first ``warm``
    replays are not counted."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(chunks.shape[0])]
    for i, (e0, e1) in enumerate(ev):
        static.copy_(chunks[i])
        e0.record()
        graph.replay()
        e1.record()
    torch.cuda.synchronize()
    ms = [e0.elapsed_time(e1) for e0, e1 in ev[warm:]]
    return 1000 * float(np.median(ms)) / n_calls, 1000 * float(np.min(ms)) / n_calls


def section_extend() -> dict:
    """Per-call extend time at batch 1, 64, 256 (3 accepted tokens, K=8)."""
    import torch

    from saspec import SpecEngine  # noqa: F401  (engine import before timing)

    rng = np.random.default_rng(1)
    group, replays, warm, eager_calls, prompt = 16, 50, 3, 200, 1000
    per_run = (replays + warm) * (group + 1) * ACCEPTED + eager_calls * ACCEPTED
    max_len = prompt + 3 * per_run + 64
    streams = make_streams(256, max_len, rng)
    gpu, _ = new_engines(streams, prompt, max_len, with_cpu=False)
    pos = np.full(256, prompt, np.int64)
    out = {"accepted_per_row": ACCEPTED, "k": K, "calls_per_graph": group}
    for b in (1, 64, 256):
        rows = list(range(b))
        gpu.prepare(rows)
        acc_all = torch.zeros((group, b, K + 1), dtype=torch.int32, device="cuda")
        _, lens, mout, dout = device_tensors(torch, b)
        lens.fill_(ACCEPTED)
        warm_up(torch, gpu, acc_all[0], lens, mout, dout)
        n = np.full(b, ACCEPTED)
        graph, chunks_dev = group_graph(torch, gpu, streams, rows, pos, n, (acc_all, lens, mout, dout), group,
                                        replays + warm)
        one = torch.cuda.CUDAGraph()
        with torch.cuda.graph(one):
            gpu.extend(acc_all[0], lens, mout, dout)

        med, best = replay_us(torch, graph, group, acc_all, chunks_dev, warm)
        one_med, _ = replay_us(torch, one, 1, acc_all, chunks_dev, warm)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(eager_calls):
            gpu.extend(acc_all[i % group], lens, mout, dout)
        torch.cuda.synchronize()
        eager = 1e6 * (time.perf_counter() - t0) / eager_calls
        out[f"b{b}"] = {
            "graph_us_per_call_median": round(med, 2),
            "graph_us_per_call_min": round(best, 2),
            "one_call_graph_replay_us": round(one_med, 2),
            "eager_us_per_call": round(eager, 1),
        }
        say(f"batch {b:>3}: {out[f'b{b}']}")
        if int((mout.cpu() > 0).sum()) == 0:
            fail("extend", f"batch {b}: no row matched after the timed steps (workload or kernel wrong)")
    out["target_us_at_256"] = TARGET_US_AT_256
    out["meets_target"] = out["b256"]["graph_us_per_call_median"] <= TARGET_US_AT_256
    if not out["meets_target"]:
        say(
            f"!!! MISSED TARGET: {out['b256']['graph_us_per_call_median']} us per call at batch 256 > {TARGET_US_AT_256}"
        )
    return out


def section_threads() -> dict:
    """extend per call (graph replays of 16 calls) vs threads per block."""
    import torch

    threads, rounds, group, replays, warm = (1, 2, 4, 8, 32, 128), 2, 16, 12, 2
    out: dict[str, Any] = {"accepted_per_row": ACCEPTED, "k": K, "calls_per_graph": group}
    for b in (64, 256, 1024):
        rng = np.random.default_rng(b)
        prompt = 1000
        steps = rounds * len(threads) * ((replays + warm) * group + 3)
        streams = make_streams(b, prompt + steps * ACCEPTED + 16, rng)
        gpu, _ = new_engines(streams, prompt, streams.shape[1], with_cpu=False)
        rows = list(range(b))
        gpu.prepare(rows)
        dev = gpu._backend.slots._dev
        default = dev.extend_threads
        acc_all = torch.zeros((group, b, K + 1), dtype=torch.int32, device="cuda")
        _, lens, mout, dout = device_tensors(torch, b)
        lens.fill_(ACCEPTED)
        pos = np.full(b, prompt, np.int64)
        n = np.full(b, ACCEPTED)
        us: dict[int, list[float]] = {t: [] for t in threads}
        for _ in range(rounds):  # the texts grow as the rounds go: interleave the settings
            for t in threads:
                dev.extend_threads = t
                warm_up(torch, gpu, acc_all[0], lens, mout, dout)
                graph, chunks = group_graph(torch, gpu, streams, rows, pos, n, (acc_all, lens, mout, dout), group,
                                            replays + warm)
                us[t].append(replay_us(torch, graph, group, acc_all, chunks, warm)[0])
        dev.extend_threads = default
        best = {t: round(min(v), 2) for t, v in us.items()}
        fastest = min(best, key=best.get)
        out[f"b{b}"] = {"us_per_call_by_threads": best, "fastest": fastest, "default": default}
        say(f"batch {b:>4}: us per call by threads per block {best}; fastest {fastest}, default {default}")
        if best[default] > 1.05 * best[fastest]:
            say(f"!!! NOTE: at batch {b} the default of {default} thread(s) per block is not the fastest ({fastest})")
    return out


def section_tokens() -> dict:
    """extend per call vs accepted tokens per row, and the floor of a graph node."""
    import torch

    group, replays, warm, prompt, counts = 16, 20, 2, 1000, (0, 1, 3, K + 1)
    out: dict[str, Any] = {"k": K, "calls_per_graph": group}
    fill = torch.zeros(1, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(group):
            fill.fill_(1)
    dummy = torch.zeros((replays + warm, 1), dtype=torch.int32, device="cuda")
    out["floor_us_per_node"] = round(replay_us(torch, graph, group, fill, dummy, warm)[0], 2)
    say(f"graph node floor (one-element fill): {out['floor_us_per_node']} us")
    for b in (1, 256):
        rng = np.random.default_rng(7 + b)
        streams = make_streams(b, prompt + (replays + warm) * group * sum(counts) + 16, rng)
        gpu, _ = new_engines(streams, prompt, streams.shape[1], with_cpu=False)
        rows = list(range(b))
        gpu.prepare(rows)
        acc_all = torch.zeros((group, b, K + 1), dtype=torch.int32, device="cuda")
        _, lens, mout, dout = device_tensors(torch, b)
        pos = np.full(b, prompt, np.int64)
        us = {}
        for c in counts:
            lens.fill_(c)
            warm_up(torch, gpu, acc_all[0], lens, mout, dout)
            graph, chunks = group_graph(torch, gpu, streams, rows, pos, np.full(b, c), (acc_all, lens, mout, dout),
                                        group, replays + warm)
            us[c] = round(replay_us(torch, graph, group, acc_all, chunks, warm)[0], 2)
        out[f"b{b}"] = {"us_per_call_by_tokens": us}
        say(f"batch {b:>3}: us per call by accepted tokens per row {us}")
    return out


def section_overhead() -> dict:
    """Decode-step loops: no SA at all vs SA disabled (threshold=inf) vs SA on."""
    import torch

    from saspec.rules import select_drafts

    rng = np.random.default_rng(2)
    b, hidden, layers, vocab, prompt, steps, warm = 256, 4096, 8, 32000, 1000, 100, 5
    # extend calls per row: 2 warm-ups, then 2 rounds x (graph, eager) x 2 SA loops x (warm + steps)
    calls = 2 + 2 * 2 * 2 * (warm + steps)
    streams = make_streams(b, prompt + (warm + steps) * ACCEPTED, rng)
    gpu, _ = new_engines(streams, prompt, prompt + calls * ACCEPTED + 64, with_cpu=False)
    rows = list(range(b))
    gpu.prepare(rows)
    acc, lens, mout, dout = device_tensors(torch, b)
    lens.fill_(ACCEPTED)
    pos = np.full(b, prompt, np.int64)
    n = np.full(b, ACCEPTED)
    chunks = torch.from_numpy(np.stack([take(streams, rows, pos, n, K + 1) for _ in range(warm + steps)])).cuda()
    warm_up(torch, gpu, acc, lens, mout, dout)
    g = torch.Generator(device="cuda").manual_seed(0)
    weights = [
        torch.randn(hidden, hidden, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02 for _ in range(layers)
    ]
    head = torch.randn(hidden, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    x = torch.randn(b, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    offsets = torch.arange(K, device="cuda", dtype=torch.int32)
    on = torch.tensor(4, dtype=torch.int32, device="cuda")

    def model():
        h = x
        for w in weights:
            h = torch.relu(h @ w)
        tok = (h @ head).argmax(-1).to(torch.int32)
        return (tok[:, None] + offsets) % vocab  # neural drafts [b, K]

    def no_sa():
        return model()

    def sa_off():
        neural = model()
        gpu.extend(acc, lens, mout, dout)
        return select_drafts(neural, dout, mout, float("inf"))[0]

    def sa_on():
        neural = model()
        gpu.extend(acc, lens, mout, dout)
        return select_drafts(neural, dout, mout, on)[0]

    loops = {"no_sa": no_sa, "sa_disabled_inf": sa_off, "sa_enabled_thr4": sa_on}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in loops.values():
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs = {}
    for name, fn in loops.items():
        graphs[name] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[name]):
            fn()

    # Each step first copies that step's accepted tokens into the static input
    # (in every loop, SA or not, so the loops differ by the SA work alone).
    def time_graph(graph) -> float:
        for i in range(warm):
            acc.copy_(chunks[i])
            graph.replay()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for i in range(warm, warm + steps):
            acc.copy_(chunks[i])
            graph.replay()
        e1.record()
        torch.cuda.synchronize()
        return 1000 * e0.elapsed_time(e1) / steps

    def time_eager(fn) -> float:
        for i in range(warm):
            acc.copy_(chunks[i])
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(warm, warm + steps):
            acc.copy_(chunks[i])
            fn()
        torch.cuda.synchronize()
        return 1e6 * (time.perf_counter() - t0) / steps

    out: dict[str, Any] = {"batch": b, "model": f"{layers} x [{hidden}x{hidden}] bf16 + [{hidden}x{vocab}] head"}
    for mode, timer, items in (("graph", time_graph, graphs), ("eager", time_eager, loops)):
        # Two rounds, alternating, to even out clock drift; the better of the two.
        us = {name: min(timer(items[name]) for _ in range(2)) for name in items}
        base = us["no_sa"]
        out[mode] = {name: round(v, 1) for name, v in us.items()}
        out[mode]["overhead_disabled_us"] = round(us["sa_disabled_inf"] - base, 1)
        out[mode]["overhead_disabled_pct"] = round(100 * (us["sa_disabled_inf"] - base) / base, 2)
        out[mode]["overhead_enabled_us"] = round(us["sa_enabled_thr4"] - base, 1)
        say(f"{mode}: {out[mode]}")
    return out


def section_prepare() -> dict:
    """prepare() of a 32k-token prompt: host build, enqueue, and upload on the GPU."""
    import torch

    from saspec import SpecEngine, SuffixAutomaton
    from saspec.device.slots import payload_words

    rng = np.random.default_rng(3)
    n = 32768
    prompt = make_streams(1, n, rng)[0]
    eng = SpecEngine(backend="cuda", max_slots=4, max_seq_len=n + 1024)
    for w in ("w0", "w1"):  # load the upload kernels and grow both staging buffers
        eng.add_request(w, prompt)
        eng.prepare([w])
    torch.cuda.synchronize()
    ref = SuffixAutomaton(prompt)
    trials = []
    for t in range(5):  # p0, p1 into the two unused slots; p2-p4 into a reused one
        rid = f"p{t}"
        if t == 2:
            eng.remove_request("p0")
            eng.remove_request("p1")
        t0 = time.perf_counter()
        eng.add_request(rid, prompt)
        build_ms = 1000 * (time.perf_counter() - t0)
        payload = 4 * payload_words(eng._backend.host.blobs[eng._slot[rid]])
        reused = eng._backend.slots._used[eng._backend.slots._free[-1]]
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        eng.prepare([rid])
        e1.record()
        enqueue_ms = 1000 * (time.perf_counter() - t0)
        torch.cuda.synchronize()
        total_ms = 1000 * (time.perf_counter() - t0)
        acc, lens, mout, dout = device_tensors(torch, 1)
        eng.extend(acc, lens, mout, dout)  # lens 0: the prompt's own match and draft
        want = ref.draft(K).tolist()
        want += [-1] * (K - len(want))
        if int(mout.item()) != ref.match()[0] or dout[0].tolist() != want:
            fail(
                "prepare",
                f"{rid}: after upload gpu match {int(mout.item())} {dout[0].tolist()}, cpu {ref.match()[0]} {want}",
            )
        trials.append(
            {
                "slot": "reused" if reused else "fresh",
                "host_build_ms": round(build_ms, 2),
                "prepare_enqueue_ms": round(enqueue_ms, 3),
                "prepare_gpu_ms": round(e0.elapsed_time(e1), 3),
                "prepare_total_ms": round(total_ms, 3),
                "payload_bytes": payload,
            }
        )
        say(str(trials[-1]))
        if t >= 2:
            eng.remove_request(rid)
    stats = eng.stats()
    fresh = [x for x in trials if x["slot"] == "fresh"]
    reused = [x for x in trials if x["slot"] == "reused"]

    def med(xs, key):
        return round(float(np.median([x[key] for x in xs])), 3) if xs else None

    return {
        "prompt_tokens": n,
        "device_bytes_per_slot": stats["device_bytes_per_slot"],
        "device_bytes_per_token": round(stats["device_bytes_per_slot"] / stats["max_seq_len"], 1),
        "payload_bytes": trials[0]["payload_bytes"],
        "fresh_total_ms": med(fresh, "prepare_total_ms"),
        "reused_total_ms": med(reused, "prepare_total_ms"),
        "fresh_gpu_ms": med(fresh, "prepare_gpu_ms"),
        "reused_gpu_ms": med(reused, "prepare_gpu_ms"),
        "enqueue_ms": med(trials, "prepare_enqueue_ms"),
        "host_build_ms": med(trials, "host_build_ms"),
        "trials": trials,
    }


# -- report --------------------------------------------------------------------------


def section_drafter() -> dict:
    """The device drafting step per step in a CUDA graph (batch 64, 256), then its equality test on the device."""
    import torch

    from saspec.device.drafter import DeviceDrafter

    rng = np.random.default_rng(2)
    group, replays, warm, prompt = 16, 30, 3, 1000
    max_len = prompt + (replays + warm + 2) * group * ACCEPTED + 64
    streams = make_streams(256, max_len, rng)
    out: dict[str, Any] = {"accepted_per_row": ACCEPTED, "k": K, "steps_per_graph": group}
    for b in (64, 256):
        drafter = DeviceDrafter(K, b, max_len)
        for r in range(b):
            drafter.start(r, streams[r, :prompt])
        drafter.prepare(list(range(b)))
        z = dict(dtype=torch.int32, device="cuda")
        acc_all = torch.zeros((group, b, K + 1), **z)
        lens = torch.full((b,), ACCEPTED, **z)
        outs = (torch.zeros((b, K), **z), torch.zeros(b, **z), torch.zeros(b, **z), torch.zeros(b, **z))
        side = torch.cuda.Stream()  # compile and load the kernels outside the capture (lens 0: nothing appended)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                drafter.step(acc_all[0], torch.zeros_like(lens), *outs)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        pos = np.full(256, prompt, np.int64)
        n = np.full(b, ACCEPTED)
        tokens = np.stack([np.stack([take(streams, list(range(b)), pos, n, K + 1) for _ in range(group)])
                           for _ in range(replays + warm)])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for g in range(group):
                drafter.step(acc_all[g], lens, *outs)
        med, best = replay_us(torch, graph, group, acc_all, torch.from_numpy(tokens).cuda(), warm)
        drafted = int((outs[1].cpu() > 0).sum())
        out[f"b{b}"] = {"graph_us_per_step_median": round(med, 2), "graph_us_per_step_min": round(best, 2),
                        "rows_drafted_last_step": drafted}
        say(f"batch {b:>3}: {out[f'b{b}']}")
        if int((outs[3].cpu() > 0).sum()) == 0:
            fail("drafter", f"batch {b}: no row matched after the timed steps (workload or kernels wrong)")
        drafter.close()
    out["meets_goal_at_256"] = out["b256"]["graph_us_per_step_median"] <= TARGET_US_AT_256
    env = device_test_env()
    cmd = [sys.executable, "-m", "pytest", "tests/library/test_device_drafter.py", "-q", "-p", "no:cacheprovider",
           "-k", "equals_host_step and not 10000"]
    say("$ SASPEC_TEST_CUDA=device " + " ".join(cmd[1:]))
    rc, log = run_logged(cmd, TESTS_TIMEOUT_S, env)
    say("\n".join(log.strip().splitlines()[-10:]))
    if rc != 0:
        fail("drafter", f"device step != host step test: pytest exit status {rc}")
    out["equality_test"] = {"rc": rc, "summary": log.strip().splitlines()[-1] if log.strip() else ""}
    return out


def section_curves() -> dict:
    """benchmarks/gpu_step_curves.py, its curve files and log to $OUT/curves/."""
    out = Path(OUT or "/tmp/saspec-gpu-check", "curves")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_step_curves.py"), "--out", str(out)]
    say("$ " + " ".join(cmd[1:]))
    t0 = time.perf_counter()
    rc, log = run_logged(cmd, CURVES_TIMEOUT_S)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_step_curves.log").write_text(log)
    say("\n".join(log.strip().splitlines()[-12:]))
    if rc != 0:
        fail("curves", f"gpu_step_curves.py exit status {rc}")
    return {"rc": rc, "files": sorted(p.name for p in out.glob("*.json")), "seconds": round(time.perf_counter() - t0, 1)}


def table() -> str:
    s = RESULTS["sections"]
    lines = ["", "| check | result |", "| --- | --- |"]

    def row(name, value):
        lines.append(f"| {name} | {value} |")

    t = s.get("tests") or {"error": "not run"}
    row("tests on device", t.get("error") or f"rc={t.get('rc')} {t.get('summary', '')}")
    g = s.get("graph") or {"error": "not run"}
    row(
        "graph replay vs CPU",
        g.get("error")
        or f"{g['steps_mismatched']} of {g['steps']} steps differ (batch {g['batch']}; "
        f"{g['rows_with_match_pct']}% rows matched)",
    )
    def per_batch(name: str, batches: tuple[int, ...], label: str, fmt: Callable[[dict], str]) -> dict:
        sec = s.get(name) or {"error": "not run"}
        if "error" in sec:
            row(name, sec["error"])
        for b in batches:
            if sec.get(f"b{b}"):
                row(label.format(b=b), fmt(sec[f"b{b}"]))
        return sec

    e = per_batch(
        "extend",
        (1, 64, 256),
        "extend b={b} (us/call: graph median, 1-call replay, eager)",
        lambda r: f"{r['graph_us_per_call_median']} / {r['one_call_graph_replay_us']} / {r['eager_us_per_call']}",
    )
    if "meets_target" in e:
        row(f"target <= {TARGET_US_AT_256} us at b=256", "met" if e["meets_target"] else "MISSED")
    per_batch(
        "threads",
        (64, 256, 1024),
        "extend b={b} us/call by threads per block",
        lambda r: f"{r['us_per_call_by_threads']} (default {r['default']})",
    )
    tk = per_batch("tokens", (1, 256), "extend b={b} us/call by accepted tokens per row",
                   lambda r: f"{r['us_per_call_by_tokens']}")
    if "floor_us_per_node" in tk:
        row("graph node floor (us)", tk["floor_us_per_node"])
    o = s.get("overhead") or {"error": "not run"}
    if "error" in o:
        row("overhead", o["error"])
    for mode in ("graph", "eager"):
        r = o.get(mode)
        if r:
            row(
                f"step us {mode}: no SA / SA off (inf) / SA on",
                f"{r['no_sa']} / {r['sa_disabled_inf']} / {r['sa_enabled_thr4']} "
                f"(off: +{r['overhead_disabled_us']} us, {r['overhead_disabled_pct']}%)",
            )
    p = s.get("prepare") or {"error": "not run"}
    row(
        "prepare 32k tokens (ms: fresh / reused slot, GPU fresh / reused)",
        p.get("error") or f"{p['fresh_total_ms']} / {p['reused_total_ms']}, {p['fresh_gpu_ms']} / {p['reused_gpu_ms']}",
    )
    if "device_bytes_per_token" in p:
        row("device bytes per slot token", f"{p['device_bytes_per_token']} (payload {p['payload_bytes']} B)")
    return "\n".join(lines)


def main() -> int:
    t0 = time.perf_counter()
    RESULTS["env"] = section_env()
    if RESULTS["env"]["gpu"] is None:
        say("!!! torch sees no CUDA GPU: nothing to check (exit 2)")
        if OUT:
            Path(OUT).mkdir(parents=True, exist_ok=True)
            Path(OUT, "gpu_check.json").write_text(json.dumps(RESULTS, indent=2, default=str))
        return 2
    for name, fn in (
        ("tests", section_tests),
        ("graph", section_graph),
        ("extend", section_extend),
        ("threads", section_threads),
        ("tokens", section_tokens),
        ("overhead", section_overhead),
        ("prepare", section_prepare),
        ("drafter", section_drafter),
        ("curves", section_curves),
    ):
        run_section(name, fn)
    RESULTS["wall_s"] = round(time.perf_counter() - t0, 1)
    say(table())
    ok = not RESULTS["errors"] and not RESULTS["mismatches"]
    RESULTS["ok"] = ok
    if OUT:
        Path(OUT).mkdir(parents=True, exist_ok=True)
        Path(OUT, "gpu_check.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    if not ok:
        say("\n" + "!" * 72)
        say(
            f"!!! GPU CHECK FAILED: {len(RESULTS['errors'])} section error(s), {len(RESULTS['mismatches'])} mismatch(es)"
        )
        for e in RESULTS["errors"]:
            say(f"!!!   {e['section']}: {e['traceback'].strip().splitlines()[-1]}")
        for m in RESULTS["mismatches"]:
            say(f"!!!   {m['section']}: {m['what']}")
        say("!" * 72)
        return 1
    say(f"\nGPU CHECK OK in {RESULTS['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
