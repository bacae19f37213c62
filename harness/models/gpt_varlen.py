"""A GPT-style decoder trained on batches of varying sequence length.

Sequence lengths are drawn from a long-tailed distribution (lognormal,
clipped), as in a real pre-training or fine-tuning corpus; the batch at step
`long_step` is forced to `long_len` tokens, several times the median, so that
its activation peak stands well above the other steps'.  Attention is the
explicit ("eager") form: scores and probabilities are materialized, so
activation memory grows with the square of the length.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = att.masked_fill(mask[:t, :t], float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        x = x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))
        return x


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, max_len, dropout, device=None):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.ones(max_len, max_len, dtype=torch.bool).triu(1),
                             persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln(x))


def lengths(steps, median, sigma, lo, hi, long_step, long_len, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(steps):
        if s == long_step:
            out.append(long_len)
            continue
        z = torch.randn((), generator=g).item()
        out.append(int(min(hi, max(lo, round(median * math.exp(sigma * z))))))
    return out


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def build(steps=6, batch=4, vocab=2048, d=256, layers=4, heads=4, median=96, sigma=0.5,
          lo=16, hi=256, long_step=3, long_len=512, dropout=0.1, seed=0):
    torch.manual_seed(seed)
    max_len = max(hi, long_len)
    model = GPT(vocab, d, layers, heads, max_len, dropout)
    batches = []
    g = torch.Generator().manual_seed(seed + 1)
    for n in lengths(steps, median, sigma, lo, hi, long_step, long_len, seed):
        seq = torch.randint(0, vocab, (batch, n + 1), generator=g)
        batches.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return {"model": model, "batches": batches, "loss_fn": loss_fn, "name": "gpt_varlen",
            "meta": {"sequence_lengths": [b[0].shape[1] for b in batches], "batch": batch}}
