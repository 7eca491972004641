"""Exports: every stored point of a run as CSV, and figures as PNG (matplotlib).

Written into SESSION/exports/; each function returns the paths it wrote. Core layer: no
torch, no textual; matplotlib is imported only here, with the Agg backend (no display).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from .divergence import divergence
from .store import SessionStore

FIG_SIZE_IN = (10.0, 6.0)
FIG_DPI = 100           # 1000 x 600 pixels


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow(["" if r.get(c) is None else r[c] for c in columns])
    return path


def export_csv(store: SessionStore, run_id: int, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    steps = store.steps(run_id)
    step_cols = ["step", "epoch", "elapsed", "loss", "lr", "grad_norm", "samples_per_s",
                 "data_s", "compute_s", "rss_bytes", "cuda_alloc", "cuda_reserved", "cuda_peak"]
    return [
        _write_csv(out / f"run-{run_id}-steps.csv", steps, step_cols),
        _write_csv(out / f"run-{run_id}-evals.csv", store.evals(run_id),
                   ["step", "epoch", "loss", "accuracy"]),
        _write_csv(out / f"run-{run_id}-fingerprints.csv", store.fingerprints(run_id),
                   ["step", "sha256", "l2"]),
    ]


def export_png(store: SessionStore, run_ids: list[int], out: Path) -> list[Path]:
    """loss, throughput and memory for the runs (overlaid), and divergence for a pair."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    tag = "-".join(map(str, run_ids))
    runs = {r: store.run(r) for r in run_ids}
    steps = {r: store.steps(r) for r in run_ids}
    written = []

    def figure(name: str, title: str, ylabel: str, series: list[tuple[str, list, list]],
               logy: bool = False) -> None:
        fig, ax = plt.subplots(figsize=FIG_SIZE_IN, dpi=FIG_DPI)
        for label, xs, ys in series:
            ax.plot(xs, ys, label=label, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / f"runs-{tag}-{name}.png"
        fig.savefig(path, dpi=FIG_DPI)
        plt.close(fig)
        written.append(path)

    def col(r: int, key: str, scale: float = 1.0) -> tuple[list, list]:
        pts = [(s["step"], s[key] * scale) for s in steps[r] if s.get(key) is not None]
        return [p[0] for p in pts], [p[1] for p in pts]

    def label(r: int) -> str:
        return f"run {r} ({runs[r]['name']})"

    figure("loss", "Training loss", "loss (negative log-likelihood)",
           [(label(r), *col(r, "loss")) for r in run_ids])
    figure("throughput", "Throughput", "samples / s",
           [(label(r), *col(r, "samples_per_s")) for r in run_ids])
    mem = [(f"{label(r)} RSS", *col(r, "rss_bytes", 1 / 2**20)) for r in run_ids]
    mem += [(f"{label(r)} CUDA peak", *col(r, "cuda_peak", 1 / 2**20)) for r in run_ids
            if any(s.get("cuda_peak") for s in steps[r])]
    figure("memory", "Memory", "MiB", mem)
    if len(run_ids) == 2:
        a, b = run_ids
        d = divergence(steps[a], steps[b], store.fingerprints(a), store.fingerprints(b))
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=FIG_SIZE_IN, dpi=FIG_DPI, sharex=True)
        ax1.plot(d.steps, d.loss_delta, label=f"|loss {a} - loss {b}|", linewidth=1.2)
        ax1.set_ylabel("|Δloss|")
        ax1.legend()
        ax1.grid(True, alpha=0.3)
        pts = [(s, v) for s, v in zip(d.fp_steps, d.param_distance, strict=True)
               if v is not None]
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                 label="parameter distance (sketch estimate)", linewidth=1.2)
        if d.first_difference is not None:
            for ax in (ax1, ax2):
                ax.axvline(d.first_difference, color="red", linestyle="--", linewidth=1,
                           label=f"first differing hash: step {d.first_difference}")
        ax2.set_ylabel("L2 distance")
        ax2.set_xlabel("optimizer step")
        ax2.legend()
        ax2.grid(True, alpha=0.3)
        verdict = ("bit-identical" if d.identical else "not identical"
                   if d.identical is False else "no common fingerprint")
        fig.suptitle(f"Divergence of run {a} and run {b}: {verdict}")
        fig.tight_layout()
        path = out / f"runs-{tag}-divergence.png"
        fig.savefig(path, dpi=FIG_DPI)
        plt.close(fig)
        written.append(path)
    return written
