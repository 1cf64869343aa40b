"""`saspec calibrate`: time this machine's target and draft-model forwards (1..33
tokens per row at batch 1 and 64) and the automaton's extend, and write the cost
profile `saspec simulate` reads (:mod:`saspec_bench.costmodel`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..costmodel import DEFAULT_BATCHES, MAX_TOKENS, calibrate
from ..datafiles import CPU_PROFILE_PATH
from ..lm import add_model_arguments, load_models
from ..options import CliError, comma_list, output_file, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``saspec calibrate``'s options."""
    p.add_argument("--out", default=str(CPU_PROFILE_PATH), type=output_file,
                   help="profile JSON to write (the default path is what `saspec simulate` reads)")
    add_model_arguments(p)
    p.add_argument("--batches", type=comma_list(positive_int, what="batch size"), default=DEFAULT_BATCHES,
                   help="batch sizes to time")
    p.add_argument("--context", type=positive_int, default=512, help="cached tokens per row during the timed forwards")
    p.add_argument("--tokens", type=comma_list(positive_int, what="token count"), default=None,
                   help="tokens per row to time (default: 1..33 at batch 1; 1,2,3,5,9,17,33 at larger batches)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed forwards per point at batch 1 (best kept)")
    p.add_argument("--name", default=None, help="the profile's name in tables (default: cpu (measured, MODELS))")
    p.add_argument("--fast-verify", action=argparse.BooleanOptionalAction, default=True,
                   help="time the float32 linears as the loop runs them (saspec.integrations.hf.fast_small_linears); "
                        "--no-fast-verify: torch's own F.linear")


def main(args: argparse.Namespace) -> int:
    """Run ``saspec calibrate``: time this machine's forwards, write the profile to ``--out``."""
    import torch

    if args.tokens is not None and max(args.tokens) > MAX_TOKENS:
        raise CliError(f"--tokens: at most {MAX_TOKENS} tokens per row")
    if args.tokens is not None and len(args.tokens) < 2:
        raise CliError("--tokens: give at least two token counts (the profile interpolates between them)")
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    target, draft, tname, dname, _ = load_models(args)
    name = args.name or f"cpu (measured: {tname} + {dname}, {args.dtype}, {threads} threads)"
    tokens = {b: list(args.tokens) for b in args.batches} if args.tokens else None
    prof = calibrate(target, draft, name=name, batches=tuple(args.batches), context=args.context, tokens=tokens,
                     repeats=args.repeats, notes={"target": tname, "draft": dname, "dtype": args.dtype,
                                                  "threads": threads, "fast_verify": args.fast_verify},
                     log=lambda msg: print(msg, file=sys.stderr))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    prof.save(args.out)
    print(f"profile {name!r}: {args.out}")
    return 0


def add_command(sub: argparse._SubParsersAction) -> None:
    """Register ``calibrate`` on the ``saspec`` parser (torch loads only when it runs)."""
    p = sub.add_parser("calibrate", help="time target/draft-model forwards here: the CPU cost profile",
                       description="Time target and draft-model forwards for 1..33 tokens per row at batch 1 and "
                                   "64, and the SA's extend; write the cost profile `saspec simulate` uses.")
    add_arguments(p)
    p.set_defaults(func=main)
