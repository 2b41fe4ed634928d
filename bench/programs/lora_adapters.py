"""A frozen transformers GPT-2 base (made from a config, no downloads) with small trainable
low-rank adapters beside each block's attention projection: most memory is frozen weights
read every step, little is written."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from common import Steps, report, seed, train_lm


class Adapter(torch.nn.Module):
    """base(x) + x A B, with A, B of rank r; B starts at zero so the base's output is kept."""

    def __init__(self, base, r=8):
        super().__init__()
        self.base = base
        n_in, n_out = base.weight.shape  # transformers' Conv1D keeps (in, out)
        self.a = torch.nn.Parameter(torch.randn(n_in, r) * 0.01)
        self.b = torch.nn.Parameter(torch.zeros(r, n_out))

    def forward(self, x):
        return self.base(x) + x @ self.a @ self.b


seed()
cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=512, vocab_size=16384)
model = GPT2LMHeadModel(cfg)
model.requires_grad_(False)
for block in model.transformer.h:
    block.attn.c_attn = Adapter(block.attn.c_attn)
model = model.cuda()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
steps = Steps()
train_lm(model, opt, cfg.vocab_size, (8, 512), 20, steps)
report(steps)
