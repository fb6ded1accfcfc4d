"""Draws docs/assets/virtual-clock.png from raysim's own clock (``raysim.sim.clock.Schedule``).

Eight clients, three dispatched a round, half-normal delays (σ = 1.5 rounds), five rounds: each
job is a bar from its dispatch to its arrival time, and it is delivered to the server in the round
its arrival falls in. Its staleness in rounds is that round minus its dispatch round.

    python docs/figures/virtual_clock.py          # rewrites docs/assets/virtual-clock.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from raysim.sim.clock import Schedule  # noqa: E402
from raysim.sim.delays import HalfNormal, HalfNormalParams  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "assets" / "virtual-clock.png"
CLIENTS, PER_ROUND, ROUNDS, SIGMA, SEED = 8, 3, 5, 1.5, 3


def jobs() -> list[tuple[int, int, float, int]]:
    """``(client, dispatch round, arrival time, delivery round)`` for every job of the figure."""
    model = HalfNormal(HalfNormalParams(kind="half_normal", sigma=SIGMA), CLIENTS, SEED)
    schedule = Schedule(CLIENTS, PER_ROUND, model, SEED)
    out = []
    for k in range(ROUNDS):
        d = schedule.dispatch(k)
        triples = zip(d.clients, d.arrival_times, d.arrival_rounds, strict=True)
        out += [(int(c), k, float(t), int(r)) for c, t, r in triples]
    return out


def main() -> None:
    fig, ax = plt.subplots(figsize=(9, 3.6), dpi=110)
    horizon = ROUNDS + 3
    for k in range(horizon + 1):
        ax.axvline(k, color="0.85", lw=0.8, zorder=0)
    for client, k, t, r in jobs():
        y = client
        ax.plot([k, t], [y, y], color="tab:blue", lw=5, solid_capstyle="butt", alpha=0.75)
        ax.plot([k], [y], marker="|", color="black", ms=12)
        ax.plot([t], [y], marker="o", color="tab:orange", ms=5)
        ax.annotate(f"τ={r - k}", (t, y), xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.set_yticks(range(CLIENTS), [f"client {c}" for c in range(CLIENTS)])
    ax.set_xticks([k + 0.5 for k in range(horizon)], [f"round {k}" for k in range(horizon)])
    ax.tick_params(axis="x", length=0)
    ax.set_xlim(-0.15, horizon)
    ax.set_ylim(-0.7, CLIENTS - 0.3)
    ax.invert_yaxis()
    ax.set_title(
        f"{PER_ROUND} idle clients dispatched at the start of each round (|), half-normal delay "
        f"σ={SIGMA};\nan update arriving at • is applied in that round; τ = staleness in rounds",
        fontsize=9,
    )
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
