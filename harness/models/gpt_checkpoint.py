"""A GPT-style decoder whose blocks run under activation checkpointing.

Each transformer block runs as
`torch.utils.checkpoint.checkpoint(block, x, use_reentrant=<reentrant>)`:
the forward keeps only each block's input, and the backward runs the block's
forward again (recomputation) before its backward.  `reentrant=0` (the
default) is the form PyTorch recommends (saved-tensor hooks); `reentrant=1`
the older autograd.Function form (recomputes inside a nested backward).
`checkpoint=0` runs the same model without checkpointing, for comparison.
Fixed sequence length; the blocks are gpt_varlen's (eager attention).
"""
import functools
import os
import sys

import torch
import torch.utils.checkpoint

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import gpt_varlen  # noqa: E402
from gpt_varlen import loss_fn  # noqa: E402


class GPT(gpt_varlen.GPT):
    """gpt_varlen's model, its blocks run under checkpoint() when asked."""

    def __init__(self, vocab, d, layers, heads, max_len, dropout, checkpoint, reentrant):
        super().__init__(vocab, d, layers, heads, max_len, dropout)
        self.checkpoint = bool(checkpoint)
        self.reentrant = bool(reentrant)

    def forward(self, idx):
        if not self.checkpoint:
            return super().forward(idx)
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = torch.utils.checkpoint.checkpoint(
                functools.partial(blk, mask=self.mask), x, use_reentrant=self.reentrant)
        return self.head(self.ln(x))


def build(steps=3, batch=4, seq=256, vocab=2048, d=256, layers=4, heads=4, dropout=0.1,
          checkpoint=1, reentrant=0, seed=0):
    torch.manual_seed(seed)
    model = GPT(vocab, d, layers, heads, seq, dropout, checkpoint, reentrant)
    g = torch.Generator().manual_seed(seed + 1)
    batches = []
    for _ in range(steps):
        s = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        batches.append((s[:, :-1].contiguous(), s[:, 1:].contiguous()))
    return {"model": model, "batches": batches, "loss_fn": loss_fn, "name": "gpt_checkpoint",
            "meta": {"checkpoint": bool(checkpoint), "use_reentrant": bool(reentrant),
                     "layers": layers, "batch": batch, "sequence_length": seq}}
