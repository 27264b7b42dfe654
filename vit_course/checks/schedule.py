"""Check for chapter 06's learning-rate schedule: warmup_cosine."""

import math

from .common import reference
from .core import check

HINTS = {
    "warmup0": "the warmup is off by one: step 0 should already get base_lr / warmup_steps, "
               "base_lr * (step + 1) / warmup_steps, so no step is wasted at lr 0",
    "warmup+1": "the warmup divides by warmup_steps + 1: base_lr * (step + 1) / warmup_steps reaches base_lr at the "
                "last warmup step",
    "warmup_min": "the warmup starts from min_lr: it rises from 0, base_lr * (step + 1) / warmup_steps",
    "nomin": "the cosine ends at 0, not min_lr: min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * t))",
    "from0": "the cosine phase starts counting at step 0: t = (step - warmup_steps) / (total_steps - warmup_steps)",
    "total": "the cosine phase is divided by total_steps: t = (step - warmup_steps) / (total_steps - warmup_steps)",
    "end-1": "the cosine reaches min_lr one step early: t = (step - warmup_steps) / (total_steps - warmup_steps), "
             "which is 1 at step = total_steps",
    "linear": "this decays linearly: after the warmup use 0.5 * (1 + cos(pi * t))",
}


def _wrong(step, total, warmup, base, low, kind):
    """The rate of the mistake ``kind`` (a key of HINTS)."""
    if step < warmup:
        rise = {"warmup0": step / warmup, "warmup+1": (step + 1) / (warmup + 1)}.get(kind, (step + 1) / warmup)
        return low + (base - low) * rise if kind == "warmup_min" else base * rise
    t = {"from0": step / max(1, total), "total": (step - warmup) / max(1, total),
         "end-1": (step - warmup) / max(1, total - warmup - 1)}.get(kind, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return low + (base - low) * (1 - t)
    if kind == "nomin":
        return base * 0.5 * (1 + math.cos(math.pi * t))
    return low + (base - low) * 0.5 * (1 + math.cos(math.pi * t))


@check("warmup_cosine")
def warmup_cosine(c, fn):
    """warmup_cosine(step, total_steps, warmup_steps, base_lr, min_lr=0.0): linear warmup, then cosine to min_lr,
    which it reaches at step = total_steps."""
    for total, warmup, base, low in ((20, 5, 1e-3, 1e-5), (10, 0, 0.1, 0.0), (7, 3, 2.0, 0.5), (50, 1, 5e-4, 0.0)):
        kwargs = {"min_lr": low} if low else {}
        for step in range(total + 1):
            got = c.number(c.call(fn, step, total, warmup, base, **kwargs), f"the learning rate at step {step}")
            expected = reference("warmup_cosine")(step, total, warmup, base, low)
            if not math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-12):
                hint = next((h for kind, h in HINTS.items() if math.isclose(
                    got, _wrong(step, total, warmup, base, low, kind), rel_tol=1e-6, abs_tol=1e-12)), None)
                c.fail(f"at step {step} of {total} (warmup {warmup}, base_lr {base}, min_lr {low}) the rate is "
                       f"{got:.6g}, expected {expected:.6g}", hint)
            c.tests += 1
