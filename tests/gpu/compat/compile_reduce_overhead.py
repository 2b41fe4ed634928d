"""torch.compile with mode="reduce-overhead": Inductor's kernels replayed through CUDA graphs."""
import torch

from common import Steps, report, seed

seed()
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)


@torch.compile(mode="reduce-overhead")
def loss_of(x, y):
    return torch.nn.functional.mse_loss(model(x), y)


steps = Steps()
g = torch.Generator(device="cuda").manual_seed(1)
for _ in range(25):
    x = torch.randn(128, 512, device="cuda", generator=g)
    y = torch.randn(128, 512, device="cuda", generator=g)
    with steps:
        torch.compiler.cudagraph_mark_step_begin()
        loss = loss_of(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    steps.loss(loss.item())
report(steps)
