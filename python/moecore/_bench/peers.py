"""PyTorch CPU peers: what a transformers-style model runs for an MoE layer on CPU.

* eager: the per-expert loop of transformers' MoE blocks (gather the expert's tokens, two
  linears, silu(gate)·up, weight, index_add), in bf16 or fp32, on dequantized weights;
* grouped: torch._grouped_mm over the expert-sorted tokens (bf16; where torch has it on CPU).

Slots routed to −1 (experts of other EP ranks) contribute nothing, as in moecore.
"""

from __future__ import annotations


def eager(torch, x, w13, w2, weights, ids):
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        if e < 0:
            continue
        token, slot = torch.nonzero(ids == e, as_tuple=True)
        h = x[token] @ w13[e].T
        a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = (a @ w2[e].T).float() * weights[token, slot, None]
        out.index_add_(0, token, y)
    return out


def grouped(torch, x, w13_t, w2_t, weights, ids):
    """w13_t [E, H, 2I] and w2_t [E, I, H] (transposed views of the expert weights)."""
    inter = w2_t.shape[1]
    flat = ids.reshape(-1)
    valid = torch.nonzero(flat >= 0, as_tuple=True)[0]
    order = valid[torch.argsort(flat[valid], stable=True)]
    counts = torch.bincount(flat[order], minlength=w13_t.shape[0])
    offs = torch.cumsum(counts, 0).to(torch.int32)
    token = order // ids.shape[1]
    h = torch._grouped_mm(x[token], w13_t, offs=offs)
    a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    y = torch._grouped_mm(a, w2_t, offs=offs).float() * weights.reshape(-1)[order, None]
    out = torch.zeros(x.shape, dtype=torch.float32)
    out.index_add_(0, token, y)
    return out


def has_grouped_mm(torch) -> bool:
    """torch._grouped_mm exists and runs bf16 on CPU."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        a = torch.ones((2, 8), dtype=torch.bfloat16)
        b = torch.ones((1, 8, 8), dtype=torch.bfloat16)
        torch._grouped_mm(a, b, offs=torch.tensor([2], dtype=torch.int32))
    except (RuntimeError, NotImplementedError):
        return False
    return True
