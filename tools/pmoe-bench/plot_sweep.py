#!/usr/bin/env python3
"""Draws a pmoe-bench result for --plot. Called by pmoe-bench (report.cpp).

usage: plot_sweep.py ROWS.csv OUT.png SPEC.json

SPEC keys: x, y (column names), x_label, y_label (axis labels in words, with units), title,
series (column: one line per value, or ""), panel (column: one panel per value, or ""),
panel_label (words before each panel's value), log_y (bool), log_x (bool, base 2), bars (bool: y per category x,
with min/max whiskers from y_min / y_max columns when given).
"""
import csv
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def number(text):
    value = float(text)
    return int(value) if value.is_integer() else value


def draw_lines(ax, rows, spec):
    series = {}
    for row in rows:
        name = row[spec["series"]] if spec["series"] else spec["y_label"]
        series.setdefault(name, []).append((number(row[spec["x"]]), float(row[spec["y"]])))
    xs = sorted({p[0] for points in series.values() for p in points})
    for name, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    if all(isinstance(x, int) for x in xs):
        # Rank counts and token counts are integers: tick exactly the values measured.
        ax.set_xticks(xs) if len(xs) <= 12 else ax.xaxis.set_major_locator(
            MaxNLocator(integer=True))
    if spec.get("log_y"):
        ax.set_yscale("log")
    if spec.get("log_x"):
        # Sizes that double (EP8 .. EP1024): evenly spaced, ticked at the values drawn.
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
    if spec["series"]:
        ax.legend(fontsize="small")


def draw_bars(ax, rows, spec):
    names = [row[spec["x"]] for row in rows]
    values = [float(row[spec["y"]]) for row in rows]
    errors = None
    if spec.get("y_min") and spec.get("y_max"):
        errors = [[v - float(r[spec["y_min"]]) for v, r in zip(values, rows)],
                  [float(r[spec["y_max"]]) - v for v, r in zip(values, rows)]]
    ax.bar(names, values, yerr=errors, capsize=4)
    ax.tick_params(axis="x", labelrotation=20)


def main(csv_path, png_path, spec_path):
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    with open(spec_path) as f:
        spec = json.load(f)
    panels = {}
    for row in rows:
        key = number(row[spec["panel"]]) if spec.get("panel") else ""
        panels.setdefault(key, []).append(row)
    keys = sorted(panels)
    columns = min(len(keys), 3)
    lines = math.ceil(len(keys) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(5.5 * columns, 4 * lines), squeeze=False)
    for i, key in enumerate(keys):
        ax = axes[i // columns][i % columns]
        (draw_bars if spec.get("bars") else draw_lines)(ax, panels[key], spec)
        ax.set_xlabel(spec["x_label"])
        ax.set_ylabel(spec["y_label"])
        if spec.get("panel"):
            ax.set_title(f"{spec['panel_label']} {key}", fontsize="medium")
        ax.grid(True, alpha=0.3)
    for j in range(len(keys), lines * columns):
        axes[j // columns][j % columns].set_visible(False)
    fig.suptitle(spec["title"])
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
