"""What the calibrated point leans on: each unpublished knob moved across its plausible range,
the others held at their calibrated values, and the headline figures' response over seeds
(issue 27)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from planner.calibrate import KNOBS

FIGURES = {"tok_s_user": "tok/s per user", "ttft_p90_s": "TTFT p90 (s)"}


def sweep(measure: Callable[[list[dict[str, float]]], list[list[dict]]],
          knobs: dict[str, float], points: int = 4) -> dict[str, list[dict]]:
    """For each knob, `points` values from its low to its high end (and its calibrated value).
    `measure` takes every setting at once (to run them side by side) and gives each one's runs,
    one per seed: a figure is their mean, with their [min, max]."""
    settings = [(name, v) for name, k in KNOBS.items() if k.moves_fit
                for v in sorted({*np.linspace(k.low, k.high, points).round(6).tolist(),
                                 knobs[name]})]
    results = measure([{**knobs, name: v} for name, v in settings])
    out: dict[str, list[dict]] = {}
    for (name, v), runs in zip(settings, results, strict=True):
        row: dict = {"value": v, "seeds": len(runs)}
        for f in FIGURES:
            values = [r[f] for r in runs]
            row[f] = sum(values) / len(values)
            row[f"{f}_range"] = [min(values), max(values)]
        out.setdefault(name, []).append(row)
    return out


def plot(sweeps: dict[str, list[dict]], knobs: dict[str, float], path: Path, title: str,
         target_tok_s: float, ttft_slo_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(FIGURES), len(sweeps), figsize=(3 * len(sweeps), 5.5),
                             squeeze=False)
    for col, (name, rows) in enumerate(sweeps.items()):
        for row, (figure, label) in enumerate(FIGURES.items()):
            ax = axes[row][col]
            x = [r["value"] for r in rows]
            ax.plot(x, [r[figure] for r in rows], "o-")
            ax.fill_between(x, [r[f"{figure}_range"][0] for r in rows],
                            [r[f"{figure}_range"][1] for r in rows], alpha=0.25)
            ax.axvline(knobs[name], color="tab:red", lw=0.8)
            ax.axhline(target_tok_s if figure == "tok_s_user" else ttft_slo_s, color="grey",
                       lw=0.8)
            if figure == "ttft_p90_s":
                ax.set_yscale("log")
                ax.set_xlabel(name)
            if col == 0:
                ax.set_ylabel(label)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
