"""torch.compile default mode: Triton kernels launched through the driver API."""
import torch

from common import Steps, report, seed, train

seed()
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.LayerNorm(2048),
                            torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = Steps()
train(torch.compile(model), opt, (128, 512), 25, steps)
report(steps)
