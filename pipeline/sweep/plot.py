"""DIR/pareto.png: quality (kl) against batch-1 speed and against size, one panel each, every
built variant labelled, the Pareto front (pareto.py, all objectives) drawn filled and each
panel's own two-objective front connected."""

from __future__ import annotations

from pathlib import Path

from .errors import SweepError
from .results import Row

__all__ = ["PARETO_PNG", "require_matplotlib", "write_plot"]

PARETO_PNG = "pareto.png"
_MIB = 2**20


def require_matplotlib() -> None:
    """Before any build: the plot is one of the sweep's three results."""
    try:
        import matplotlib  # noqa: F401  (optional: only the sweep draws; a runtime install has none)
    except ImportError:
        raise SweepError(
            "ingot sweep draws pareto.png with matplotlib: pip install 'matplotlib>=3.8'"
        ) from None


def write_plot(out: Path, rows: list[Row]) -> Path:
    # matplotlib is optional and slow to import: only the sweep draws
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # after the backend: only the sweep draws

    built = [r for r in rows if r.error is None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), constrained_layout=True)
    panels = [
        (axes[0], "tok_s_batch1", 1.0, "batch-1 decode tok/s (higher is better)", True),
        (axes[1], "artifact_bytes", _MIB, "artifact MiB (lower is better)", False),
    ]
    for ax, field, scale, label, higher in panels:
        xs = [getattr(r, field) / scale for r in built]
        ys = [r.kl for r in built]
        front = _front_2d(list(zip(xs, ys, strict=True)), higher)
        ax.plot([p[0] for p in front], [p[1] for p in front], "-", color="tab:blue", lw=1)
        for r, x, y in zip(built, xs, ys, strict=True):
            style = dict(color="tab:blue") if r.pareto else dict(mfc="none", color="tab:gray")
            ax.plot([x], [y], "o", **style)
            ax.annotate(r.name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel(label)
        ax.set_ylabel("mean KL to the original, nats/token (lower is better)")
        ax.ticklabel_format(useOffset=False)  # sizes a few bytes apart: no "+1.196e1"
        ax.grid(alpha=0.3)
    fig.suptitle("ingot sweep: filled = Pareto front (kl, size, tok/s b1 and b32)")
    path = out / PARETO_PNG
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _front_2d(points: list[tuple[float, float]], higher: bool) -> list[tuple[float, float]]:
    """The panel's own front, sorted by x: no other point has as low a y and as good an x."""

    def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
        x_ok = a[0] >= b[0] if higher else a[0] <= b[0]
        x_lt = a[0] > b[0] if higher else a[0] < b[0]
        return x_ok and a[1] <= b[1] and (x_lt or a[1] < b[1])

    return sorted(p for p in points if not any(better(o, p) for o in points))
