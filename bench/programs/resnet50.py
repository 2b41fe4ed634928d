"""torchvision's ResNet-50 (weights=None: nothing is downloaded) on one fixed synthetic
batch: bf16 autocast, channels_last, SGD with momentum."""
import torch
import torchvision

from common import Steps, report, seed

seed()
model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator(device="cuda").manual_seed(1)
x = torch.randn(64, 3, 224, 224, device="cuda", generator=g).to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (64,), device="cuda", generator=g)
steps = Steps()
for _ in range(20):
    with steps:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    steps.loss(loss.item())
report(steps)
