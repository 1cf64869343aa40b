"""The forward that catches vLLM's draft model up, as vLLM's draft-model proposer takes it.

vLLM's draft-model proposer starts each step with a forward of the draft model
over the target's scheduled tokens (plus the token just sampled): it writes the
draft's KV cache at exactly those positions, then drafts. The hybrid skips it
where no row takes a neural draft; the step that next needs it reads what was
skipped, as ``saspec.catch_up_plan.DraftCatchUp`` plans it. This module rebuilds
that first forward's inputs from a plan: its KV slots come from the request's
block table (the draft model's KV lives in the target's blocks), and the
proposer's own first-pass code appends each row's next token and samples there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...catch_up_plan import CatchUpPlan


def forward_inputs(plan: CatchUpPlan, cad: Any, block_size: int) -> dict[str, Any]:
    """vLLM's ``propose`` arguments that make the draft model read ``plan`` (torch tensors on the device
    of ``cad``, the target's ``CommonAttentionMetadata`` of the step, whose block table they read)."""
    import torch

    dev = cad.query_start_loc.device
    b = len(plan.req_ids)
    positions = torch.from_numpy(plan.positions).to(dev)
    rows = torch.repeat_interleave(torch.arange(b, device=dev), torch.from_numpy(np.diff(plan.query_start)).to(dev))
    table = cad.block_table_tensor[:b]
    slots = table[rows, positions // block_size].to(torch.int64) * block_size + positions % block_size
    qsl_cpu = torch.from_numpy(plan.query_start)
    seq_cpu = torch.from_numpy(plan.stops)  # KV after the query; the proposer adds the extra slot
    new_cad = type(cad)(query_start_loc=qsl_cpu.to(dev), query_start_loc_cpu=qsl_cpu, seq_lens=seq_cpu.to(dev),
                        seq_lens_cpu_upper_bound=seq_cpu, num_reqs=b, num_actual_tokens=int(plan.tokens.shape[0]),
                        max_query_len=int(np.diff(plan.query_start).max(initial=1)),
                        max_seq_len=int(plan.stops.max(initial=1)), block_table_tensor=table, slot_mapping=slots,
                        causal=True)
    return {"target_token_ids": torch.from_numpy(plan.tokens).to(dev), "target_positions": positions,
            "next_token_ids": torch.from_numpy(plan.next_tokens).to(dev), "token_indices_to_sample": None,
            "common_attn_metadata": new_cad, "num_rejected_tokens_gpu": None, "mm_embed_inputs": None}
