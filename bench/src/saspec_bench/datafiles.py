"""Where the bench's shipped data lives: recorded real outputs, the cross-request
recordings and the measured CPU cost profile (all under ``saspec_bench/data``)."""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
REAL_OUTPUTS_PATH = DATA_DIR / "real_outputs.jsonl.gz"  # `saspec record-traces`
CROSS_REQUESTS_PATH = DATA_DIR / "cross_requests.jsonl.gz"  # `saspec record-traces --cross-requests`
CPU_PROFILE_PATH = DATA_DIR / "cpu_profile.json"  # `saspec calibrate`
