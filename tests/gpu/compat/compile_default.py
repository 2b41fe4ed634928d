"""torch.compile default mode: Triton kernels launched through the driver API."""
import torch

from common import Steps, report, seed

seed()
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.LayerNorm(2048),
                            torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
cmodel = torch.compile(model)
steps = Steps()
g = torch.Generator(device="cuda").manual_seed(1)
for _ in range(25):
    x = torch.randn(128, 512, device="cuda", generator=g)
    with steps:
        loss = cmodel(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    steps.loss(loss.item())
report(steps)
