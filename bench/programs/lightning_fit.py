"""A LightningModule trained by lightning's Trainer.fit: the loop, the optimizer's step and
the data loading are Lightning's; a callback times each batch and keeps its loss."""
import lightning as L
import torch

from common import Steps, report, seed


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096),
                                       torch.nn.GELU(), torch.nn.Linear(4096, 1024))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Timed(L.Callback):
    def __init__(self, steps):
        self.steps = steps

    def on_train_batch_start(self, *_):
        self.steps.__enter__()

    def on_train_batch_end(self, trainer, module, outputs, *_):
        self.steps.__exit__(None, None, None)
        self.steps.loss(outputs["loss"].item())


seed()
g = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(torch.randn(20 * 256, 1024, generator=g), torch.randn(20 * 256, 1024, generator=g))
steps = Steps()
trainer = L.Trainer(max_steps=20, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, callbacks=[Timed(steps)])
trainer.fit(Net(), torch.utils.data.DataLoader(data, batch_size=256, shuffle=False))
report(steps)
