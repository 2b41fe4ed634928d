"""A training step captured whole into a CUDA graph (torch.cuda.graph: warm-up on a side
stream, then forward, backward and an SGD step captured) and replayed."""
import torch

from common import Steps, report, seed

seed()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 1024, device="cuda")
y = torch.randn(256, 1024, device="cuda")
static_x, static_y = x.clone(), y.clone()

side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(static_x), static_y).backward()
        opt.step()
torch.cuda.current_stream().wait_stream(side)

graph = torch.cuda.CUDAGraph()
opt.zero_grad(set_to_none=True)
with torch.cuda.graph(graph):
    static_loss = torch.nn.functional.mse_loss(model(static_x), static_y)
    static_loss.backward()
    opt.step()

steps = Steps()
g = torch.Generator(device="cuda").manual_seed(1)
for _ in range(30):
    with steps:
        static_x.copy_(torch.randn(256, 1024, device="cuda", generator=g))
        graph.replay()
    steps.loss(static_loss.item())
report(steps)
