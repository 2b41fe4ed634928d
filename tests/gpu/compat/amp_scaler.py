"""fp16 autocast with torch.amp.GradScaler; the first steps overflow on purpose (a huge
initial scale), so the found-inf check, the skipped steps and unscale all run."""
import torch

from common import Steps, report, seed

seed()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 40)
g = torch.Generator(device="cuda").manual_seed(1)
steps = Steps()
for _ in range(30):
    x = torch.randn(256, 1024, device="cuda", generator=g)
    with steps:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    steps.loss(loss.item())
report(steps, final_scale=scaler.get_scale())
