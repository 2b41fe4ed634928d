"""torch.profiler recording CUDA kernels of a training loop (CUPTI, shared with psshim's own
subscription): the trace must hold kernel events."""
import torch
from torch.profiler import ProfilerActivity, profile

from common import Steps, report, seed, train

seed()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = Steps()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    train(model, opt, (256, 1024), 15, steps)
kernels = sum(1 for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
report(steps, cuda_events=kernels)
if kernels == 0:
    raise SystemExit("the profiler recorded no CUDA kernels")
