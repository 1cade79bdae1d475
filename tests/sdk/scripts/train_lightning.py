"""A Lightning training recorded by detlab.integrations.lightning.DetlabCallback: one process, or DDP over
gloo under `torchrun --nproc-per-node N`. Deterministic on CPU: seeded model and data, one thread per rank.

Usage: python train_lightning.py OUT [--steps N] [--grads] [--optimizer-state] [--package pytorch_lightning]
                                     [--flip STEP:RANK:TENSOR] [--raise-at STEP] [--checkpoint] [--resume]

--checkpoint saves the trainer's checkpoint at the end as OUT.ckpt; --resume fits from it (ckpt_path=).

--flip moves one element of the parameter TENSOR by one ulp on RANK after optimizer step STEP, in a
callback that runs before detlab's; --raise-at raises in training_step of the batch after step STEP.
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch

from detlab.integrations.lightning import DetlabCallback


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--grads", action="store_true")
    parser.add_argument("--optimizer-state", action="store_true")
    parser.add_argument("--package", default="lightning.pytorch", choices=["lightning.pytorch", "pytorch_lightning"])
    parser.add_argument("--flip", default="-1:-1:")
    parser.add_argument("--raise-at", type=int, default=-1)
    parser.add_argument("--checkpoint", action="store_true")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    pl = importlib.import_module(args.package)
    flip_step, flip_rank, flip_name = args.flip.split(":")

    class Regression(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            if self.trainer.global_step == args.raise_at:
                raise RuntimeError("a failure the test asked for")
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    class Flip(pl.Callback):  # type: ignore[misc,name-defined]
        def on_train_batch_end(self, trainer: object, module: Regression, *rest: object) -> None:
            if module.trainer.global_step == int(flip_step) and module.global_rank == int(flip_rank):
                with torch.no_grad():
                    first = module.get_parameter(flip_name).view(-1)[:1]
                    first.copy_(torch.nextafter(first, torch.full_like(first, float("inf"))))

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    model = Regression()
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto",
                         max_steps=args.steps, deterministic=True, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Flip(), DetlabCallback(args.out, grads=args.grads,
                                                           optimizer_state=args.optimizer_state)])
    trainer.fit(model, data, ckpt_path=f"{args.out}.ckpt" if args.resume else None)
    if args.checkpoint:
        trainer.save_checkpoint(f"{args.out}.ckpt")


if __name__ == "__main__":
    main()
