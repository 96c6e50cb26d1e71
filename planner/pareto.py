"""tok/s per GPU against tok/s per user: the trade a deployment picks a point on (issue 27).
Every simulated point of a search is one (ratio, sessions) operating point; the front keeps
those that no other point beats on both."""

from __future__ import annotations

from pathlib import Path


def front(points: list[dict]) -> list[dict]:
    """The points no other point matches or beats on both `per_gpu` and `per_user` (higher is
    better), by `per_user` descending; only points marked `ok` (TTFT within its SLO) count."""
    points = [p for p in points if p.get("ok", True)]
    kept = [p for p in points
            if not any(q["per_gpu"] >= p["per_gpu"] and q["per_user"] >= p["per_user"]
                       and (q["per_gpu"], q["per_user"]) != (p["per_gpu"], p["per_user"])
                       for q in points)]
    return sorted(kept, key=lambda p: -p["per_user"])


def plot(points: list[dict], path: Path, title: str, target_tok_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, label in enumerate(sorted({p["label"] for p in points})):
        color = f"C{i}"
        for ok, marker in ((True, "o"), (False, "x")):
            mine = [p for p in points if p["label"] == label and p.get("ok", True) == ok]
            ax.scatter([p["per_user"] for p in mine], [p["per_gpu"] for p in mine], s=18,
                       marker=marker, color=color, label=label if ok else None)
    edge = front(points)
    ax.plot([p["per_user"] for p in edge], [p["per_gpu"] for p in edge], "k-", lw=1,
            label="Pareto front (x: TTFT p90 over the SLO, left out)")
    ax.axvline(target_tok_s, color="grey", lw=0.8)
    ax.set_xlabel("tok/s per user (decoding)")
    ax.set_ylabel("output tok/s per GPU")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title, fontsize=7, wrap=True)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
