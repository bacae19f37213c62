"""A Llama-7B-shaped decoder: 32 layers, hidden 4096, 32 heads, FFN 11008
(SwiGLU), vocabulary 32000, RMSNorm, rotary embeddings; sequence 4096,
batch 1, bf16 parameters, AdamW (states in bf16: pure-bf16 training).

Built on the meta device by default (no memory, no compute): the recorder
logs PyTorch's real allocation sizes and order from shapes alone.  Attention
is one fused op, `spillway_models::flash_attn` (and its backward), standing
for FlashAttention as 7B models are trained at this length: it saves q, k, v,
the output and a float32 log-sum-exp per row, never the L x L scores.  On CPU
it computes causal attention for real (for small configurations and tests).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

_NS = "spillway_models"


def _flash_fwd_cpu(q, k, v):
    # q, k, v: (B, L, H, D); returns out (B, L, H, D), lse (B, H, L) float32
    scale = 1.0 / math.sqrt(q.shape[-1])
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    s = (qt @ kt.transpose(-2, -1)) * scale
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    out = (p @ vt).transpose(1, 2).to(q.dtype).contiguous()
    return out, lse.contiguous()


def _flash_bwd_cpu(dout, q, k, v, out, lse):
    scale = 1.0 / math.sqrt(q.shape[-1])
    qt, kt, vt, ot, dot = (x.transpose(1, 2).float() for x in (q, k, v, out, dout))
    s = (qt @ kt.transpose(-2, -1)) * scale
    n = s.shape[-1]
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ dot
    dp = dot @ vt.transpose(-2, -1)
    ds = p * (dp - (dot * ot).sum(-1, keepdim=True))
    dq = (ds @ kt) * scale
    dk = (ds.transpose(-2, -1) @ qt) * scale
    return tuple(x.transpose(1, 2).to(q.dtype).contiguous() for x in (dq, dk, dv))


def _flash_fwd_meta(q, k, v):
    b, l, h, _ = q.shape
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty((b, h, l), dtype=torch.float32, device=q.device))


def _flash_bwd_meta(dout, q, k, v, out, lse):
    return tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in (q, k, v))


def _define_ops():
    try:
        torch.ops.spillway_models.flash_attn
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library(_NS, "DEF")
    lib.define("flash_attn(Tensor q, Tensor k, Tensor v) -> (Tensor, Tensor)")
    lib.define("flash_attn_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
               "Tensor lse) -> (Tensor, Tensor, Tensor)")
    for key, fwd, bwd in (("CPU", _flash_fwd_cpu, _flash_bwd_cpu),
                          ("Meta", _flash_fwd_meta, _flash_bwd_meta)):
        lib.impl("flash_attn", fwd, key)
        lib.impl("flash_attn_backward", bwd, key)
    # torch 1.13 has no autograd fallthrough for Meta: step below autograd by hand
    # (FlashAttention below is the op's autograd)
    def below_autograd(name):
        def kernel(*args):
            guard = torch._C._AutoDispatchBelowAutograd()  # a guard object in 1.13
            try:
                return getattr(torch.ops.spillway_models, name)(*args)
            finally:
                del guard
        return kernel
    lib.impl("flash_attn", below_autograd("flash_attn"), "AutogradMeta")
    lib.impl("flash_attn_backward", below_autograd("flash_attn_backward"), "AutogradMeta")
    _define_ops.lib = lib   # keep the registration alive


_define_ops()


class FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        out, lse = torch.ops.spillway_models.flash_attn(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        return torch.ops.spillway_models.flash_attn_backward(dout, q, k, v, out, lse)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5, **kw):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, **kw))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Layer(nn.Module):
    def __init__(self, d, heads, ffn, **kw):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(d, **kw)
        self.q = nn.Linear(d, d, bias=False, **kw)
        self.k = nn.Linear(d, d, bias=False, **kw)
        self.v = nn.Linear(d, d, bias=False, **kw)
        self.o = nn.Linear(d, d, bias=False, **kw)
        self.ffn_norm = RMSNorm(d, **kw)
        self.gate = nn.Linear(d, ffn, bias=False, **kw)
        self.up = nn.Linear(d, ffn, bias=False, **kw)
        self.down = nn.Linear(ffn, d, bias=False, **kw)

    def forward(self, x, cos, sin):
        b, l, d = x.shape
        h = self.attn_norm(x)
        q = self.q(h).view(b, l, self.heads, d // self.heads)
        k = self.k(h).view(b, l, self.heads, d // self.heads)
        v = self.v(h).view(b, l, self.heads, d // self.heads)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = FlashAttention.apply(q, k, v).reshape(b, l, d)
        x = x + self.o(a)
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab, d, layers, heads, ffn, **kw):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d, **kw)
        self.layers = nn.ModuleList(Layer(d, heads, ffn, **kw) for _ in range(layers))
        self.norm = RMSNorm(d, **kw)
        self.head = nn.Linear(d, vocab, bias=False, **kw)

    def forward(self, idx):
        b, l = idx.shape
        hd = self.embed.weight.shape[1] // self.heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=idx.device).float() / hd))
        freqs = torch.outer(torch.arange(l, device=idx.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        dtype = self.embed.weight.dtype
        cos = emb.cos().to(dtype)[None, :, None, :]
        sin = emb.sin().to(dtype)[None, :, None, :]
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x)).float()


def loss_fn(logits, target):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def build(layers=32, d=4096, heads=32, ffn=11008, vocab=32000, seq=4096, batch=1, steps=1,
          device="meta", dtype="bfloat16", seed=0):
    torch.manual_seed(seed)
    kw = {"device": device, "dtype": getattr(torch, dtype)}
    model = Llama(vocab, d, layers, heads, ffn, **kw)
    g = torch.Generator().manual_seed(seed + 1)
    batches = []
    for _ in range(steps):
        seqs = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
        batches.append((seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()))
    return {"model": model, "batches": batches, "loss_fn": loss_fn, "name": "llama7b",
            "meta": {"layers": layers, "hidden": d, "heads": heads, "ffn": ffn, "vocab": vocab,
                     "seq": seq, "batch": batch, "attention": "fused (flash_attn)"}}
