"""A transformers GPT-2 made from a config (no downloads) and trained on random tokens."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from common import Steps, report, seed, train_lm

seed()
cfg = GPT2Config(n_layer=4, n_head=8, n_embd=512, n_positions=256, vocab_size=8192)
model = GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
steps = Steps()
train_lm(model, opt, cfg.vocab_size, (8, 256), 20, steps)
report(steps)
