"""The recorder's one-pass kernel (detlab.tensors.onepass_triton) on GPT-2 small's parameters, on one GPU.

Times, with CUDA events (median of 7 repetitions of 50 launches each), on the 124M float32 parameters of
GPT-2 small laid out as the model holds them: one `.sum()` of as many float32 values (the read of memory
every pass pays), the fingerprint alone (fp2, detlab.tensors.fingerprint.triton_impl), and the one-pass
step (fingerprint, stats and drift sketch, with the per-tensor sums and copies it queues) as the recorder runs
it: one replay of its captured CUDA graph. Prints one line each and the JSON.

    python bench/onepass.py
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

import torch

from detlab.tensors import onepass_triton
from detlab.tensors.fingerprint import triton_impl


def gpt2_small_shapes(layers: int = 12, embd: int = 768, vocab: int = 50257, ctx: int = 1024) -> list[tuple]:
    shapes: list[tuple] = [(vocab, embd), (ctx, embd)]
    for _ in range(layers):
        shapes += [(embd,), (embd,), (3 * embd, embd), (3 * embd,), (embd, embd), (embd,), (embd,), (embd,),
                   (4 * embd, embd), (4 * embd,), (embd, 4 * embd), (embd,)]
    return shapes + [(embd,), (embd,)]


def time_ms(fn: Callable[[], object], reps: int = 50) -> dict[str, float]:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = []
    for _ in range(7):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / reps)
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs)}


def main() -> None:
    dev = torch.device("cuda", 0)
    g = torch.Generator(dev).manual_seed(0)
    tensors = [torch.randn(s, device=dev, generator=g) for s in gpt2_small_shapes()]
    n = sum(t.numel() for t in tensors)
    flat = torch.randn(n, device=dev, generator=g)
    fp_plan = triton_impl.plan(tensors)
    plan = onepass_triton.plan(tensors, range(len(tensors)))
    slot = onepass_triton._new_slot(plan)
    for _ in range(2):  # launched, then captured: what the recorder replays every step
        onepass_triton.run(plan, slot)
    assert slot.graph is not None
    ms = {"sum": time_ms(lambda: flat.sum()), "fingerprint": time_ms(lambda: triton_impl.launch(fp_plan)),
          "one_pass": time_ms(slot.graph.replay)}
    for name, t in ms.items():
        print(f"{name:12s} {t['median']:.4f} ms (min {t['min']:.4f}, max {t['max']:.4f})")
    print(json.dumps({"device": torch.cuda.get_device_name(dev), "parameters": n, "ms": ms}))


if __name__ == "__main__":
    main()
