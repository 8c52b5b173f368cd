#!/usr/bin/env python3
"""Draws one pmoe-bench sweep: y over x, one line per series. Called by pmoe-bench --plot.

usage: plot_sweep.py ROWS.csv OUT.png X_KEY Y_KEY SERIES_KEY TITLE [log]
SERIES_KEY may be ""; "log" draws y on a log scale (for series that differ by orders of magnitude).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(csv_path, png_path, x_key, y_key, series_key, title, scale="linear"):
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    series = {}
    for row in rows:
        name = row[series_key] if series_key else y_key
        series.setdefault(name, []).append((float(row[x_key]), float(row[y_key])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    if scale == "log":
        ax.set_yscale("log")
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if series_key:
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) not in (7, 8):
        sys.exit(__doc__)
    main(*sys.argv[1:])
