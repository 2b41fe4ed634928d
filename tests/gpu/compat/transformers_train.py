"""A transformers GPT-2 made from a config (no downloads) and trained on random tokens."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from common import Steps, report, seed

seed()
cfg = GPT2Config(n_layer=4, n_head=8, n_embd=512, n_positions=256, vocab_size=8192)
model = GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
g = torch.Generator(device="cuda").manual_seed(1)
steps = Steps()
for _ in range(20):
    ids = torch.randint(0, cfg.vocab_size, (8, 256), device="cuda", generator=g)
    with steps:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    steps.loss(loss.item())
report(steps)
