"""The simulator's real drafter, draft-length rules and modeled speed.

``walk_real`` replays greedy speculative decoding over per-position arrays like
``simulate.walk``, with the step semantics of ``generate.py``'s loop:

* SA draft length per step from a rule (``select.draft_length``: fixed K, or
  a function of the match length and of the previous step's acceptance), SA
  drafts recorded up to ``k_sa`` tokens wide (default 32);
* the neural source is either the modeled drafter (i.i.d. acceptance, drafts
  free) or a real draft model (``nn_acc`` = its accepted runs, see
  ``draft_runs``), whose cost is tracked like ``ModelDrafter`` pays it: ``k_nn``
  forwards per drafting step, the first feeding every accepted token its KV
  cache has not seen (after rejections, and after the steps the hybrid gave to
  the SA), and no more than the tokens left in the output (as the loop does
  before ``max_new_tokens``, and as verification is charged here);
* the hybrid is ``loop.SAModelDrafter``'s rule: the SA draft when it is non-empty and
  its match is >= T (or the SA has failed fewer than ``patience`` steps in a
  row), else the draft model;
* every step is charged ``target(verified tokens) + drafter cost`` under a
  :class:`~saspec_bench.costmodel.Profile`.

For ``none``, ``sa``, ``draft-model`` and the hybrid (any T, patience,
per-match cap) the step count equals the loop's target forwards on the same
output (``tests/test_draft_runs.py`` checks it against ``speculative_generate``
on tiny models). Adaptive and tree have no loop counterpart; they are charged
a draft-model draft on *every* step (adaptive scores it every step; tree
verifies it with the SA's).
"""

from __future__ import annotations

import numpy as np
from saspec import kernel_cache  # noqa: F401  (first: saspec's numba cache locator for the kernels below)
from numba import njit

from saspec.build import DEFAULT_OCCURRENCE
from saspec.policy import N_BUCKETS
from saspec.rules import DRAFT_LENGTH_RULES, HYBRID_THRESHOLD, draft_length

from .adaptive_rule import adaptive_init, adaptive_observe, adaptive_prefers_sa
from .costmodel import Profile, default_profiles, lookup
from .positions import ADAPTIVE, HYBRID, NEURAL, NONE, SA, TREE, Flat, neural_positions, sa_positions

SA_WIDTH = 32  # SA drafts are recorded this wide: any rule may draft up to 32 tokens

# stats vector of walk_real
ST_STEPS, ST_SA_STEPS, ST_VERIFIED, ST_DRAFT_FWD, ST_DRAFT_FED, ST_SECONDS, ST_NN_STEPS = range(7)
N_STATS = 7


def sa_positions_wide(flat: Flat, k: int = SA_WIDTH, occurrence: str = DEFAULT_OCCURRENCE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Like ``positions.sa_positions`` (one token per ``extend`` call, every
    trace batched), and also the number of valid draft tokens (before the
    first -1) at every position. Returns (match, accepted, ndraft), int32
    arrays aligned with ``flat.tokens``; ``accepted`` and ``ndraft`` are for
    drafts ``k`` tokens wide (a shorter draft is their prefix)."""
    ndraft = np.zeros(flat.tokens.shape[0], np.int32)
    match, accepted = sa_positions(flat, k, occurrence, ndraft=ndraft)
    return match, accepted, ndraft


@njit(cache=True)
def walk_real(offsets, prompt_lens, match, sa_acc, sa_len, nn_acc, mode, threshold, patience, k_sa, rule, scale,
              k_nn, nn_is_model, prior_nn, tgt_s, drf_s, sa_step_s, hist, stats):
    """Replay every trace with one rule; accumulate into ``stats`` (float64
    [N_STATS]: steps, SA steps, verified tokens, draft-model forwards,
    draft-model tokens fed, modeled seconds, draft-model steps) and ``hist``
    (steps by tokens accepted, bonus included).

    Arrays aligned with the flat outputs: ``match``, ``sa_acc`` (accepted SA
    tokens of a ``k_sa``-wide draft), ``sa_len`` (its valid tokens),
    ``nn_acc`` (accepted neural tokens: modeled, or the draft model's
    uncapped runs). ``prompt_lens`` int64 [n_traces]. ``mode``: one of
    the modes of ``positions`` (NONE/NEURAL/SA/HYBRID/ADAPTIVE/TREE). ``rule``/``scale``: the
    SA draft-length rule (``select.draft_length``). ``nn_is_model``: charge
    the neural drafts as draft-model forwards (else free). ``tgt_s``,
    ``drf_s``: seconds of a forward with n tokens at index n-1; ``sa_step_s``:
    seconds per SA extend (charged on every step of a mode that uses the SA).
    """
    g_sum = np.zeros(N_BUCKETS)
    g_cnt = np.zeros(N_BUCKETS)
    adaptive_init(g_sum, g_cnt, k_nn)
    uses_sa = mode == SA or mode == HYBRID or mode == ADAPTIVE or mode == TREE
    for tr in range(offsets.shape[0] - 1):
        pos = offsets[tr]
        start = offsets[tr]
        end = offsets[tr + 1]
        plen = prompt_lens[tr]
        cached = plen - 1  # draft model: the prompt but its last token was prefilled (not charged)
        fails = 0
        last = -1
        r_nn = prior_nn
        r_sa_ratio = 1.0
        while pos < end:
            m = match[pos]
            rem = end - pos - 1
            l_sa = 0
            if m > 0:
                l_sa = min(sa_len[pos], draft_length(m, k_sa, rule, scale, last))
            a_sa = min(sa_acc[pos], l_sa)
            a_nn = min(nn_acc[pos], k_nn)
            src = 0  # 0 none, 1 sa, 2 nn, 3 both (tree)
            if mode == NEURAL:
                src = 2
            elif mode == SA:
                src = 1 if l_sa > 0 else 0
            elif mode == HYBRID:
                src = 1 if l_sa > 0 and (m >= threshold or fails < patience) else 2
            elif mode == ADAPTIVE:
                src = 1 if l_sa > 0 and adaptive_prefers_sa(g_sum, g_cnt, r_sa_ratio, r_nn, m) else 2
            elif mode == TREE:
                src = 3 if l_sa > 0 and m >= threshold else 2
            if src == 0:
                n_draft = 0
                a = 0
            elif src == 1:
                n_draft = min(l_sa, rem)
                a = min(a_sa, n_draft)
            elif src == 2:
                n_draft = min(k_nn, rem)
                a = min(a_nn, n_draft)
            else:
                n_draft = min(l_sa, rem) + min(k_nn, rem)
                a = max(min(a_sa, rem), min(a_nn, rem))
            new = a + 1
            seconds = lookup(tgt_s, n_draft + 1)
            if uses_sa:
                seconds += sa_step_s
            model_runs = src >= 2 or mode == ADAPTIVE
            k_run = min(k_nn, rem)  # the loop drafts nothing it could not verify
            if nn_is_model and model_runs and mode != NONE and k_run > 0:
                seq_len = plen + (pos - start)
                fed = seq_len - cached
                seconds += lookup(drf_s, fed) + (k_run - 1) * drf_s[0]
                stats[ST_DRAFT_FWD] += k_run
                stats[ST_DRAFT_FED] += fed + k_run - 1
                cached = seq_len + min(min(nn_acc[pos], k_run - 1), new)
            if mode == ADAPTIVE:
                r_sa_ratio, r_nn = adaptive_observe(g_sum, g_cnt, r_sa_ratio, r_nn, m, min(a_sa, new), min(a_nn, new))
            hit = l_sa > 0 and sa_acc[pos] >= 1
            fails = 0 if hit else fails + 1
            last = a
            hist[new] += 1
            stats[ST_STEPS] += 1
            if src == 1 or (src == 3 and a_sa > a_nn):
                stats[ST_SA_STEPS] += 1
            if src >= 2:
                stats[ST_NN_STEPS] += 1
            stats[ST_VERIFIED] += n_draft + 1
            stats[ST_SECONDS] += seconds
            pos += new


_MODES = {"none": NONE, "neural": NEURAL, "sa": SA, "hybrid": HYBRID, "adaptive": ADAPTIVE, "tree": TREE}


class Arrays:
    """The per-position arrays one workload's costed walks share.

    ``flat``: the workload; ``match``, ``sa_acc``, ``sa_len``: from
    :func:`sa_positions_wide` (``SA_WIDTH`` wide); ``neural``: the modeled
    drafter's accepted tokens (int32 [N], ``positions.neural_positions``);
    ``runs``: the draft model's runs (int32 [N]) or None."""

    def __init__(self, flat: Flat, neural: np.ndarray, occurrence: str = DEFAULT_OCCURRENCE) -> None:
        self.flat = flat
        self.match, self.sa_acc, self.sa_len = sa_positions_wide(flat, SA_WIDTH, occurrence)
        self.neural = np.ascontiguousarray(neural, np.int32)
        runs = getattr(flat, "draft_runs", None)
        self.runs = None if runs is None else np.ascontiguousarray(runs, np.int32)
        self.prompt_lens = np.array([p.size for p in flat.prompts], np.int64)


def run_costed(arr: Arrays, profile: Profile, batch: int, mode: str, *, source: str = "model", threshold: int = HYBRID_THRESHOLD,
               patience: int = 0, k_sa: int = 8, rule: str = "fixed", scale: float = 1.0, k_nn: int = 8) -> dict:
    """One costed walk: {"steps", "AL", "verified_per_step", "draft_forwards_per_step",
    "draft_fed_per_step" (draft-model tokens fed, the prefill of the prompt
    but its last token excluded), "sa_frac", "nn_frac", "seconds", "tok_s",
    "hist"}. ``source``: the neural drafter, ``"model"`` (the draft model's
    runs; required by modes that use it) or ``"modeled"``."""
    if mode not in _MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(_MODES)}")
    if mode in ("none", "sa"):  # the neural source is not used
        source = "modeled" if arr.runs is None else source
    if source == "model":
        if arr.runs is None:
            raise ValueError("this workload has no draft-model runs")
        nn, is_model = arr.runs, True
    elif source == "modeled":
        nn, is_model = arr.neural, False
    else:
        raise ValueError(f"source must be 'model' or 'modeled', got {source!r}")
    if not 1 <= k_sa <= SA_WIDTH:
        raise ValueError(f"k_sa must be in [1, {SA_WIDTH}], got {k_sa}")
    costs = profile.batches[batch]
    hist = np.zeros(max(k_sa, k_nn) * 2 + 2, np.int64)
    stats = np.zeros(N_STATS)
    prior = float(np.mean(np.minimum(nn, k_nn))) if nn.size else 0.0
    walk_real(arr.flat.offsets, arr.prompt_lens, arr.match, arr.sa_acc, arr.sa_len, nn, _MODES[mode], threshold,
              patience, k_sa, DRAFT_LENGTH_RULES.index(rule), float(scale), k_nn, is_model, prior,
              costs.target_s, costs.draft_s, costs.sa_step_s, hist, stats)
    steps = stats[ST_STEPS]
    n_tok = int(arr.flat.tokens.shape[0])
    return {"steps": int(steps), "AL": n_tok / steps, "verified_per_step": stats[ST_VERIFIED] / steps,
            "draft_forwards_per_step": stats[ST_DRAFT_FWD] / steps,
            "draft_fed_per_step": stats[ST_DRAFT_FED] / steps, "sa_frac": stats[ST_SA_STEPS] / steps,
            "nn_frac": stats[ST_NN_STEPS] / steps, "seconds": stats[ST_SECONDS],
            "tok_s": batch * n_tok / stats[ST_SECONDS], "hist": hist}


# -- the tables ------------------------------------------------------------------------

LENGTH_CANDIDATES = (("fixed", 1.0), ("per-match", 0.5), ("per-match", 1.0), ("per-match", 2.0),
                     ("per-match", 4.0), ("per-match-recent", 1.0), ("per-match-recent", 2.0),
                     ("per-match-recent", 4.0))


def speed_configs(has_model: bool, k: int, threshold: int, rule: tuple[str, float],
                  model_threshold: int | None = None) -> list[tuple[str, dict]]:
    """(row name, run_costed keywords) of the speed table's rows;
    ``model_threshold`` (default ``threshold``): T of the hybrid rows over the
    real draft model with long SA drafts (see :func:`model_threshold_study`)."""
    r, s = rule
    mt = threshold if model_threshold is None else model_threshold
    rows = [("none", dict(mode="none")),
            (f"neural (modeled, free) K={k}", dict(mode="neural", source="modeled", k_nn=k)),
            (f"sa K={k}", dict(mode="sa", k_sa=k)),
            (f"sa K=32 {r}:{s:g}", dict(mode="sa", k_sa=32, rule=r, scale=s)),
            (f"hybrid(modeled) T={threshold} K={k}", dict(mode="hybrid", source="modeled", k_nn=k, k_sa=k,
                                                           threshold=threshold))]
    if has_model:
        for kn in (3, 8):
            rows += [(f"draft-model K={kn}", dict(mode="neural", k_nn=kn)),
                     (f"hybrid:draft-model T={threshold} K={kn}", dict(mode="hybrid", k_nn=kn, k_sa=kn,
                                                                        threshold=threshold)),
                     (f"hybrid:draft-model T={mt} K={kn} SA<=32 {r}:{s:g}",
                      dict(mode="hybrid", k_nn=kn, k_sa=32, rule=r, scale=s, threshold=mt))]
        rows += [(f"adaptive:draft-model K=8", dict(mode="adaptive", k_nn=8, k_sa=8)),
                 (f"tree:draft-model T={threshold} K=8", dict(mode="tree", k_nn=8, k_sa=8, threshold=threshold))]
    return rows


def length_study(arrays: dict[str, Arrays], profiles: list[Profile], threshold: int = HYBRID_THRESHOLD,
                 candidates=LENGTH_CANDIDATES) -> dict:
    """Modeled tokens/s of each draft-length rule (SA up to 32 tokens), for
    SA alone and for the hybrid with the draft model (the modeled drafter
    where a workload has no runs, K=8), per workload, profile and batch.

    Returns {"rows": [{"rule", "scale", "setting", "workload", "profile",
    "batch", "tok_s", "AL", "verified_per_step"}], "best": (rule, scale)}:
    the best is the candidate with the highest geometric mean, over every
    (setting, workload, profile, batch), of its tokens/s relative to the
    fixed rule's."""
    rows = []
    for name, arr in arrays.items():
        src = "model" if arr.runs is not None else "modeled"
        for prof in profiles:
            for b in sorted(prof.batches):
                for rule, scale in candidates:
                    for setting, kw in (("sa", dict(mode="sa")),
                                        (f"hybrid({src})", dict(mode="hybrid", source=src, k_nn=8, threshold=threshold))):
                        res = run_costed(arr, prof, b, k_sa=32, rule=rule, scale=scale, **kw)
                        rows.append({"rule": rule, "scale": scale, "setting": setting, "workload": name,
                                     "profile": prof.name, "batch": b, "tok_s": res["tok_s"], "AL": res["AL"],
                                     "verified_per_step": res["verified_per_step"]})
    base = {(r["setting"], r["workload"], r["profile"], r["batch"]): r["tok_s"] for r in rows if r["rule"] == "fixed"}
    score = {}
    for rule, scale in candidates:
        rel = [r["tok_s"] / base[(r["setting"], r["workload"], r["profile"], r["batch"])] for r in rows
               if (r["rule"], r["scale"]) == (rule, scale)]
        score[(rule, scale)] = float(np.exp(np.mean(np.log(rel)))) if rel else 0.0
    best = max(score, key=score.get)
    return {"rows": rows, "score": {f"{r}:{s:g}": v for (r, s), v in score.items()}, "best": best}


MODEL_THRESHOLDS = (4, 6, 8, 12, 16)


def model_threshold_study(arrays: dict[str, Arrays], profiles: list[Profile], rule: tuple[str, float],
                          candidates: tuple[int, ...] = MODEL_THRESHOLDS) -> dict | None:
    """The hybrid's threshold over a real draft model (SA drafts up to 32
    tokens under ``rule``): for each candidate T, the modeled tokens/s of
    the hybrid over the draft model alone at K=3 and K=8, on every workload
    with draft-model runs, profile and batch. The best T has the highest
    geometric mean among those never below 1.0x (never slower than the draft
    model alone); if none qualifies, the highest worst case. Returns
    {"ratios": {T: [ratios]}, "best": T} or None without runs."""
    named = [arr for arr in arrays.values() if arr.runs is not None]
    if not named:
        return None
    r, s = rule
    ratios: dict[int, list[float]] = {t: [] for t in candidates}
    for arr in named:
        for kn in (3, 8):
            for prof in profiles:
                for b in sorted(prof.batches):
                    alone = run_costed(arr, prof, b, "neural", k_nn=kn)["tok_s"]
                    for t in candidates:
                        hy = run_costed(arr, prof, b, "hybrid", k_nn=kn, k_sa=32, rule=r, scale=s, threshold=t)
                        ratios[t].append(hy["tok_s"] / alone)
    safe = [t for t in candidates if min(ratios[t]) >= 1.0]
    if safe:
        best = max(safe, key=lambda t: float(np.mean(np.log(ratios[t]))))
    else:
        best = max(candidates, key=lambda t: min(ratios[t]))
    return {"ratios": ratios, "best": best}


def format_threshold_study(study: dict) -> str:
    lines = ["| T | tok/s vs draft model alone: geometric mean | worst |", "|---|---|---|"]
    for t, v in study["ratios"].items():
        lines.append(f"| {t} | {float(np.exp(np.mean(np.log(v)))):.3f}x | {min(v):.3f}x |")
    lines.append(f"\nhybrid threshold over the real draft model: T={study['best']} (highest geometric mean among the "
                 "thresholds never slower than the draft model alone; chosen on these same traces)")
    return "\n".join(lines)


def speed_table(arrays: dict[str, Arrays], profiles: list[Profile], k: int, threshold: int,
                rule: tuple[str, float], model_threshold: int | None = None) -> list[dict]:
    """Every speed-table row per workload: AL, verified/step, draft-model
    forwards/step and modeled tokens/s per (profile, batch)."""
    out = []
    for name, arr in arrays.items():
        for row, kw in speed_configs(arr.runs is not None, k, threshold, rule, model_threshold):
            cols = {}
            base = None
            for prof in profiles:
                for b in sorted(prof.batches):
                    res = run_costed(arr, prof, b, **kw)
                    cols[f"{prof.name} B={b}"] = res["tok_s"]
                    base = base or res
            out.append({"workload": name, "drafter": row, "AL": base["AL"],
                        "verified_per_step": base["verified_per_step"],
                        "draft_forwards_per_step": base["draft_forwards_per_step"], "tok_s": cols})
    return out


def format_speed(rows: list[dict], profiles: list[Profile]) -> str:
    """Markdown: the speed table, then the cost model it assumes."""
    cols = [f"{p.name} B={b}" for p in profiles for b in sorted(p.batches)]
    lines = ["| workload | drafter | AL | verified/step | draft fwd/step | "
             + " | ".join(f"tok/s {c}" for c in cols) + " |", "|---" * (5 + len(cols)) + "|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['drafter']} | {r['AL']:.3f} | {r['verified_per_step']:.2f} | "
                     f"{r['draft_forwards_per_step']:.2f} | " + " | ".join(f"{r['tok_s'][c]:.1f}" for c in cols) + " |")
    lines.append("")
    lines.append("Cost model: time per step = target forward(verified tokens per row, batch B) + drafter cost "
                 "(draft-model forwards incl. catch-up tokens; SA extend); tok/s = B x output tokens / total time; "
                 "prefills excluded; the modeled neural drafter drafts for free.")
    for p in profiles:
        lines.append(f"- {p.name}: " + "; ".join(
            f"B={b}: target {c.target_s[0] * 1e3:.2f} ms (1 token/row) .. {c.target_s[-1] * 1e3:.2f} ms "
            f"({c.target_s.size} tokens/row), draft model {c.draft_s[0] * 1e3:.2f} ms/forward, "
            f"SA {c.sa_step_s * 1e6:.1f} us/step" for b, c in sorted(p.batches.items()))
            + f" [{p.notes.get('source', '')}]")
    return "\n".join(lines)


def format_length_study(study: dict) -> str:
    lines = ["| rule:scale | tok/s vs fixed K=32 (geometric mean over workloads, profiles, batches, SA and hybrid) |",
             "|---|---|"]
    for key, v in sorted(study["score"].items(), key=lambda x: -x[1]):
        lines.append(f"| {key} | {v:.3f}x |")
    r, s = study["best"]
    lines.append(f"\nbest draft-length rule: {r} scale {s:g} (saspec.rules.draft_lengths(match_len, k_max, "
                 f"rule={r!r}, scale={s:g}))")
    return "\n".join(lines)


def real_summary(rows: list[dict], threshold: int, rule: tuple[str, float]) -> str:
    """Per workload with draft-model runs: the hybrid's ratios over the
    draft model alone at K=3 and K=8 (AL and modeled tokens/s per profile and
    batch), with the hybrid's SA drafts up to 32 tokens under ``rule``."""
    r, s = rule
    by = {(x["workload"], x["drafter"]): x for x in rows}
    names = [w for w in dict.fromkeys(x["workload"] for x in rows) if (w, "draft-model K=8") in by]
    if not names:
        return ""
    cols = list(next(iter(by.values()))["tok_s"])
    lines = ["| workload | K | hybrid AL / draft-model AL | " + " | ".join(f"tok/s ratio {c}" for c in cols) + " |",
             "|---" * (3 + len(cols)) + "|"]
    for w in names:
        for kn in (3, 8):
            dm = by[(w, f"draft-model K={kn}")]
            hy = by[(w, f"hybrid:draft-model T={threshold} K={kn} SA<=32 {r}:{s:g}")]
            lines.append(f"| {w} | {kn} | {hy['AL'] / dm['AL']:.3f}x | "
                         + " | ".join(f"{hy['tok_s'][c] / dm['tok_s'][c]:.3f}x" for c in cols) + " |")
    return "\n".join(lines)


def speed_section(flats: dict, k: int, p: tuple[float, ...], threshold: int, seed: int,
                  profiles: list[Profile] | None = None, occurrence: str = DEFAULT_OCCURRENCE) -> tuple[str, dict]:
    """The cost-model part of ``saspec simulate``: the draft-length study,
    the speed table (with the study's best rule) and, where workloads carry
    draft-model runs, the hybrid/draft-model ratios, all with the SA's
    occurrence rule ``occurrence``. Returns (markdown text, JSON-able dict)."""
    profiles = profiles or default_profiles()
    arrays = {name: Arrays(flat, neural_positions(flat, p, seed), occurrence) for name, flat in flats.items()}
    study = length_study(arrays, profiles, threshold)
    t_study = model_threshold_study(arrays, profiles, study["best"])
    t_model = t_study["best"] if t_study else threshold
    rows = speed_table(arrays, profiles, k, threshold, study["best"], t_model)
    parts = [f"Draft-length rules (SA occurrence rule {occurrence}; SA drafts up to 32 tokens; SA alone and hybrid K=8), "
             "modeled tokens/s:",
             format_length_study(study)]
    if t_study:
        parts += ["", "Hybrid threshold over the real draft model (K=3 and 8, SA drafts up to 32, every profile "
                  "and batch), modeled tokens/s:", format_threshold_study(t_study)]
    parts += ["", format_speed(rows, profiles)]
    summary = real_summary(rows, t_model, study["best"])
    if summary:
        parts += ["", f"Real draft model (teacher-forced runs): hybrid (T={t_model}) over the draft model alone",
                  summary]
    data = {"occurrence": occurrence, "profiles": [pr.as_json() for pr in profiles], "length_study": {"score": study["score"],
            "best": list(study["best"])}, "speed": rows,
            "model_threshold": None if t_study is None else {"best": t_study["best"],
                                                             "ratios": {str(t): v for t, v in t_study["ratios"].items()}}}
    return "\n".join(parts), data
