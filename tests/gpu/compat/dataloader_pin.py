"""A DataLoader with worker processes and pin_memory feeding a training loop."""
import torch
from torch.utils.data import DataLoader, TensorDataset

from common import Steps, report, seed

if __name__ == "__main__":
    seed()
    gen = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(4096, 512, generator=gen), torch.randn(4096, 512, generator=gen))
    loader = DataLoader(data, batch_size=128, num_workers=2, pin_memory=True, shuffle=False)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = Steps()
    for x, y in loader:
        with steps:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        steps.loss(loss.item())
    report(steps)
