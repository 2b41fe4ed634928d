"""torch.profiler recording CUDA kernels of a training loop (CUPTI, shared with psshim's own
subscription): the trace must hold kernel events."""
import torch
from torch.profiler import ProfilerActivity, profile

from common import Steps, report, seed

seed()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator(device="cuda").manual_seed(1)
steps = Steps()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(15):
        x = torch.randn(256, 1024, device="cuda", generator=g)
        with steps:
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        steps.loss(loss.item())
kernels = sum(1 for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
report(steps, cuda_events=kernels)
if kernels == 0:
    raise SystemExit("the profiler recorded no CUDA kernels")
