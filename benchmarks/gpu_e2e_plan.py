"""What ``benchmarks/gpu_e2e.sh`` runs in one device call, and how long each step may take.

A GPU call is the rarest thing this project gets (15 minutes of device time in all, a bare
machine each time, 1–2 minutes of it spent starting), so the script runs the most valuable
figures first (part 1) and the rest as a second call (part 2), each step under a limit that comes
from a cost model written down here, not from the tiny shape:

    step seconds = step overhead + Σ over its runs (fixed cost + rounds × round cost)
    limit        = ⌈MARGIN × step seconds⌉, and never past what is left of the call's budget
                   (MARGIN 1.5 on the GPU; TINY_MARGIN 2 for the tiny shape on shared CPUs)

The 7B figures come from the H200 (``benchmarks/RESULTS.md``, 2026-11-26): the 7B model built
from its config in 10.3 s (fp32, then cast; now built in bf16 directly), a plain PEFT loop at
3 637 tokens/s (batch 8, AdamW), FedOA 3.56× FedIT's step, a ViT-B/16 client 0.08 s, FedBaF's mix
0.3 s and the auditor 0.1 s a round, the CUDA tests 16 s. A FedIT round trains 8 clients of
32 sequences (about 10 100 tokens), so 2.8 s at that rate. The tiny figures were measured on
a 2-vCPU machine. ``python benchmarks/gpu_e2e_plan.py --shape 7b`` prints the table that
``docs/gpu.md`` shows; a test holds the two equal and part 1's sum within ``PART1_MAX_S``.

Only the standard library here: the orchestrator imports this before anything heavy.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, replace

#: a step's limit over its planned seconds (a first run on a machine never seen)
MARGIN = 1.5
#: the tiny shape's: it runs on shared 2-vCPU machines (make gpu-check, CI) whose speed varies
#: by more than 1.5x between runs (FedOA's step took 47 s on one and 63 s on another the same
#: day, planned 42); there a limit only guards against a hang, it measures nothing
TINY_MARGIN = 2.0
#: part 1's planned seconds on the H200 at most: a second call must still fit the 15 minutes
PART1_MAX_S = 450
#: the preflight's own limit, whatever the shape: a broken environment ends the call in a minute
PREFLIGHT_LIMIT_S = 60


@dataclass(frozen=True)
class RunCost:
    """One ``raysim run`` (or the plain loop, or a sweep): fixed seconds + rounds × round s."""

    fixed_s: float
    rounds: int = 0
    round_s: float = 0.0
    margin: float = MARGIN

    @property
    def seconds(self) -> float:
        return self.fixed_s + self.rounds * self.round_s

    @property
    def limit_s(self) -> int:
        return math.ceil(self.margin * self.seconds)


@dataclass(frozen=True)
class StepCost:
    """A step: its process's start, imports and the wait for a free GPU after it, then its
    runs in order (``runs``: name → cost; a step's runs are its placements, backends...)."""

    overhead_s: float
    runs: dict[str, RunCost] = field(default_factory=dict)
    note: str = ""
    margin: float = MARGIN

    @property
    def seconds(self) -> float:
        return self.overhead_s + sum(r.seconds for r in self.runs.values())

    @property
    def limit_s(self) -> int:
        return math.ceil(self.margin * self.seconds)

    def with_margin(self, margin: float) -> StepCost:
        """This step, its runs included, under ``margin``."""
        runs = {name: replace(r, margin=margin) for name, r in self.runs.items()}
        return replace(self, runs=runs, margin=margin)


# --- the H200 (7B shape) --------------------------------------------------------------------
#: one ``raysim run`` on the script's running Ray, before its first round: the driver's start
#: and connection (3 s), a worker actor and its torch/transformers/PEFT imports (6 s), the 7B
#: model built in bf16 on the GPU (5 s: 10.3 s measured for fp32 then cast), MLflow (3 s), the
#: final evaluation and the actors' end (3 s)
FIXED_7B = 20.0
#: four workers build four 7B models (13.5 GB each) on one card at once
FIXED_7B_FOUR = 26.0
#: 8 clients × 32 sequences at 3 637 tokens/s (the plain loop's rate on the H200)
ROUND_7B = 2.9
#: the step process: python, raysim's config, MLflow's client for reading runs back; the wait for
#: the GPU to be free after it
STEP_7B = 8.0

COST_7B: dict[str, StepCost] = {
    "preflight": StepCost(0.0, {"imports, GPU count, Ray start": RunCost(30.0)}),
    "plain": StepCost(
        STEP_7B, {"plain PEFT loop": RunCost(8.0, 3, ROUND_7B)}, "the model built, 3 rounds"
    ),
    "fedit": StepCost(
        STEP_7B,
        {
            "w1_seq": RunCost(FIXED_7B, 3, ROUND_7B),
            "w4_seq": RunCost(FIXED_7B_FOUR, 3, ROUND_7B * 1.2),  # four contexts time-share
            "w1_lora8": RunCost(FIXED_7B, 3, 1.0),  # multi-LoRA k = 8: 5× per token
        },
    ),
    "backends": StepCost(
        STEP_7B,
        {
            "deepspeed_zero2": RunCost(FIXED_7B + 4.0, 2, ROUND_7B + 8 * 0.4),  # import; engines
            "accelerate": RunCost(FIXED_7B + 1.0, 2, ROUND_7B),
        },
    ),
    "fedbaf": StepCost(
        STEP_7B,
        {
            "foundation": RunCost(4.0),  # ViT-B/16 built and saved (343 MB)
            "fedbaf_vit": RunCost(FIXED_7B, 3, 5 * 0.08 + 0.3 + 0.1 + 1.5),  # clients, mix, audit,
        },  # the evaluation every round
    ),
    "gpu_tests": StepCost(0.0, {"pytest": RunCost(25.0)}, "16 s measured, pytest's start"),
    # part 2: its own reference (w1_seq), so every ratio is against a run of the same call
    "fedit_more": StepCost(
        STEP_7B,
        {
            "w1_seq": RunCost(FIXED_7B, 3, ROUND_7B),
            "w1_seq_fast": RunCost(FIXED_7B, 3, ROUND_7B * 0.9),
            "w4_lora2": RunCost(FIXED_7B_FOUR, 3, 1.5),
        },
    ),
    "backends_more": StepCost(
        STEP_7B,
        {"deepspeed_zero3": RunCost(FIXED_7B + 4.0, 1, ROUND_7B + 8 * 4.0)},
        "ZeRO-3 partitions the whole base at each client's call: 1 round",
    ),
    "fedoa": StepCost(STEP_7B, {"fedoa_w1": RunCost(FIXED_7B, 2, ROUND_7B * 3.56)}),
    "tune": StepCost(
        STEP_7B,
        {"sweep": RunCost(10.0, 2, 20.0)},
        "4 trials at 0.5 GPU: two waves of two, a small LLaMA, 4 rounds each",
    ),
}

# --- the 2-vCPU machine (tiny shape: a two-layer bf16 LLaMA, a two-layer ViT at 32²), measured
# under Python 3.12 with the GPU image's packages (make gpu-check): a run's start there is about
# twice the project venv's (CUDA torch, transformers 5.17's imports). The same VM ran the same
# steps 25-30 % slower on 2026-11-28 evening than that morning (preflight 26.8 → 34.5 s, FedIT's
# three runs 108.5 → 136 s): the fixed cost is set for the slower machine
FIXED_TINY = 28.0
#: four workers importing the image's CUDA torch on 2 vCPUs at once: FedIT w4_lora2 passed its
#: 59 s limit there (the same run takes 21-28 s in the project venv)
FOUR_TINY = 30.0
ROUND_TINY = 1.0
STEP_TINY = 10.0
COST_TINY: dict[str, StepCost] = {
    "preflight": StepCost(0.0, {"imports, GPU count, Ray start": RunCost(35.0)}),
    "plain": StepCost(STEP_TINY, {"plain PEFT loop": RunCost(4.0, 3, 0.5)}),
    "fedit": StepCost(
        STEP_TINY,
        {
            "w1_seq": RunCost(FIXED_TINY, 3, ROUND_TINY),
            "w4_seq": RunCost(FIXED_TINY + FOUR_TINY, 3, ROUND_TINY),
            "w1_lora8": RunCost(FIXED_TINY, 3, ROUND_TINY),
        },
    ),
    "backends": StepCost(
        STEP_TINY,
        {
            "deepspeed_zero2": RunCost(FIXED_TINY + 6.0, 2, ROUND_TINY + 1.0),
            "accelerate": RunCost(FIXED_TINY + 2.0, 2, ROUND_TINY),
        },
    ),
    "fedbaf": StepCost(
        STEP_TINY,
        {"foundation": RunCost(2.0), "fedbaf_vit": RunCost(FIXED_TINY + 4.0, 3, 1.5)},
    ),
    "gpu_tests": StepCost(0.0, {"pytest": RunCost(15.0)}, "skipped without CUDA: their start"),
    "fedit_more": StepCost(
        STEP_TINY,
        {
            "w1_seq": RunCost(FIXED_TINY, 3, ROUND_TINY),
            "w1_seq_fast": RunCost(FIXED_TINY, 3, ROUND_TINY),
            "w4_lora2": RunCost(FIXED_TINY + FOUR_TINY, 3, ROUND_TINY),
        },
    ),
    "backends_more": StepCost(
        STEP_TINY, {"deepspeed_zero3": RunCost(FIXED_TINY + 6.0, 1, ROUND_TINY + 3.0)}
    ),
    "fedoa": StepCost(STEP_TINY, {"fedoa_w1": RunCost(FIXED_TINY, 2, ROUND_TINY * 2)}),
    "tune": StepCost(STEP_TINY, {"sweep": RunCost(30.0, 2, 15.0)}),
}

COST_TINY = {name: step.with_margin(TINY_MARGIN) for name, step in COST_TINY.items()}
COSTS = {"7b": COST_7B, "tiny": COST_TINY}
#: the steps of each part, most valuable first (a call cut short loses the least)
PARTS = {
    1: ["preflight", "plain", "fedit", "backends", "fedbaf", "gpu_tests"],
    2: ["preflight", "fedit_more", "backends_more", "fedoa", "tune"],
}


def plan(shape: str, part: int) -> list[tuple[str, StepCost]]:
    """The steps of ``part`` on ``shape``, in the order they run, with their costs."""
    costs = COSTS[shape]
    return [(name, costs[name]) for name in PARTS[part]]


def step_limit(shape: str, step: str) -> int:
    """The step's limit in seconds (the preflight's is fixed)."""
    if step == "preflight":
        return PREFLIGHT_LIMIT_S
    return COSTS[shape][step].limit_s


def run_limit(shape: str, step: str, run: str) -> int:
    """One run's limit within its step."""
    return COSTS[shape][step].runs[run].limit_s


def table(shape: str, part: int) -> str:
    """The plan as a Markdown table: each step's runs, planned seconds and limit."""
    rows = ["| step | runs: fixed s + rounds × round s | planned s | limit s |"]
    rows.append("|---|---|---|---|")
    total = 0.0
    for name, cost in plan(shape, part):
        runs = "; ".join(
            f"{r}: {c.fixed_s:g}" + (f" + {c.rounds} × {c.round_s:.3g}" if c.rounds else "")
            for r, c in cost.runs.items()
        )
        if cost.overhead_s:
            runs = f"step {cost.overhead_s:g}; {runs}"
        total += cost.seconds
        rows.append(f"| `{name}` | {runs} | {cost.seconds:.0f} | {step_limit(shape, name)} |")
    rows.append(f"| **part {part}** | | **{total:.0f}** | |")
    return "\n".join(rows)


def planned_total(shape: str, part: int) -> float:
    return sum(cost.seconds for _, cost in plan(shape, part))


def main() -> None:
    parser = argparse.ArgumentParser(description="gpu_e2e.sh's plan: each step's planned seconds")
    parser.add_argument("--shape", choices=sorted(COSTS), default="7b")
    parser.add_argument("--part", type=int, choices=sorted(PARTS), default=None)
    args = parser.parse_args()
    for part in [args.part] if args.part else sorted(PARTS):
        print(f"Part {part} ({args.shape}):\n\n{table(args.shape, part)}\n")


if __name__ == "__main__":
    main()
