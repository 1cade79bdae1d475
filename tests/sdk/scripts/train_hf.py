"""A Hugging Face Trainer training recorded by detlab.integrations.transformers.DetlabCallback, on CPU: a
one-layer GPT-2 built from its config (nothing downloaded) on seeded random tokens, one thread.

Usage: python train_hf.py OUT [--steps N] [--accumulate N] [--grads] [--optimizer-state] [--flip STEP:TENSOR]
                             [--stop-at K] [--resume K]

--stop-at K stops after step K and saves the Trainer's checkpoint under OUT.hf; --resume K trains from it
(resume_from_checkpoint=).

--flip moves one element of the parameter TENSOR by one ulp right after optimizer step STEP. Prints
{"training_loss": ...}, the Trainer's mean loss per step.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

from detlab.integrations.transformers import DetlabCallback


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--grads", action="store_true")
    parser.add_argument("--optimizer-state", action="store_true")
    parser.add_argument("--flip", default="-1:")
    parser.add_argument("--stop-at", type=int, default=0)
    parser.add_argument("--resume", type=int, default=0)
    args = parser.parse_args()
    flip_step, flip_name = args.flip.split(":")

    class Stop(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == stop_at:
                control.should_save = control.should_training_stop = True

    stop_at = args.stop_at

    class Flip(TrainerCallback):
        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step + 1 == int(flip_step):  # the step this optimizer.step() made
                with torch.no_grad():
                    first = kwargs["model"].get_parameter(flip_name).view(-1)[:1]
                    first.copy_(torch.nextafter(first, torch.full_like(first, float("inf"))))

    torch.set_num_threads(1)
    set_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                                bos_token_id=0, eos_token_id=0))
    tokens = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": t, "labels": t} for t in tokens]
    with tempfile.TemporaryDirectory() as scratch:
        kept = args.stop_at or args.resume
        training = TrainingArguments(output_dir=f"{args.out}.hf" if kept else scratch, max_steps=args.steps,
                                     per_device_train_batch_size=4,
                                     gradient_accumulation_steps=args.accumulate, learning_rate=1e-3, seed=0,
                                     use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                                     disable_tqdm=True, remove_unused_columns=False)
        callbacks = [Flip(), Stop(), DetlabCallback(args.out, grads=args.grads, optimizer_state=args.optimizer_state)]
        done = Trainer(model=model, args=training, train_dataset=data, callbacks=callbacks).train(
            resume_from_checkpoint=f"{args.out}.hf/checkpoint-{args.resume}" if args.resume else None)
    print(json.dumps({"training_loss": done.training_loss}))  # the mean of the Trainer's per-step losses


if __name__ == "__main__":
    main()
