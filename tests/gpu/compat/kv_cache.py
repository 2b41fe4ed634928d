"""Inference with a growing KV cache: a hand-written attention decoder appends one token's
keys and values per step (the cache reallocated as it grows)."""
import torch

from common import Steps, report, seed

seed()
layers, heads, dim, vocab = 4, 8, 512, 4096
emb = torch.nn.Embedding(vocab, dim).cuda().half()
qkv = [torch.nn.Linear(dim, 3 * dim).cuda().half() for _ in range(layers)]
proj = [torch.nn.Linear(dim, dim).cuda().half() for _ in range(layers)]
head = torch.nn.Linear(dim, vocab).cuda().half()
batch = 16
cache = [(torch.empty(batch, heads, 0, dim // heads, device="cuda", dtype=torch.half),) * 2 for _ in range(layers)]
tok = torch.zeros(batch, dtype=torch.long, device="cuda")
steps = Steps()
with torch.no_grad():
    for _ in range(128):
        with steps:
            h = emb(tok)
            for i in range(layers):
                q, k, v = qkv[i](h).view(batch, 3, heads, dim // heads).unbind(1)
                kc = torch.cat([cache[i][0], k.unsqueeze(2)], dim=2)
                vc = torch.cat([cache[i][1], v.unsqueeze(2)], dim=2)
                cache[i] = (kc, vc)
                a = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), kc, vc).squeeze(2)
                h = h + proj[i](a.reshape(batch, dim))
            logits = head(h).float()
            tok = logits.argmax(-1)
        steps.loss(logits.logsumexp(-1).sum().item())
report(steps)
