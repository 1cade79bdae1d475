"""The why-report's data item: did the runs read the same batches? Where the first divergent component is the
batch (rec.step(..., batch=x)), the data order differs: a sampler, a shuffle seed, data-loader workers, or a
resume that restarted its epoch."""

from __future__ import annotations

from .facts import FAIL, NOT_CHECKED, PASS, Item, WhyInput

DATA_TITLE = "Data order: the same batches at every step"


def data_order_item(data: WhyInput) -> Item:
    """Fail when the batch is the first component that differs; pass when the batches were compared and equal at
    the first divergent step; not checked when they were not recorded."""
    first = data.first_component
    step = data.first_divergent_step
    if first is not None and first.get("component") == "batch":
        names = ", ".join(first.get("tensors") or []) or "the batch"
        return Item("data", DATA_TITLE, FAIL, f"data order differs: the runs read other batches at step {step} "
                    f"({names}) before anything else parted: a sampler, a shuffle seed, data-loader workers, or a "
                    "resume that restarted its epoch")
    if first is not None and "batch" in (first.get("compared") or []):
        return Item("data", DATA_TITLE, PASS, f"the batches are equal at step {step}, where the "
                    f"{first.get('component')} parted first")
    return Item("data", DATA_TITLE, NOT_CHECKED, "the batches were not recorded (rec.step(step, model, batch=x)) "
                "or the runs did not part")
