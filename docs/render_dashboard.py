#!/usr/bin/python3
"""Renders docs/grafana-dashboard.json into a PNG without Grafana: each panel's own PromQL
queries are sent, as they are written in the JSON, to a real Prometheus (its HTTP API,
`/api/v1/query_range`) that scraped a real run, and the answers are drawn with matplotlib at the
panel's place in the dashboard's grid, under its title, with its legend format and unit.

Only `$__rate_interval` is replaced (by `--rate-interval`): it is Grafana's to fill in.
Run by docs/render-dashboard.sh, which says how the data was made.

    render_dashboard.py --prometheus http://127.0.0.1:9090 --start UNIX --end UNIX \
        --dashboard docs/grafana-dashboard.json --out docs/grafana-dashboard.png
"""

import argparse
import json
import re
import urllib.parse
import urllib.request
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

# Grafana's dark theme, roughly: background, panel, text, grid, and its classic palette.
BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
PALETTE = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#b877d9", "#5794f2",
           "#fade2a", "#ff9830", "#96d98d"]
ROW_PX, COLUMNS = 30, 24


def query_range(prometheus, expr, start, end, step):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as r:
        answer = json.load(r)
    if answer.get("status") != "success":
        raise SystemExit(f"Prometheus refused {expr!r}: {answer}")
    return answer["data"]["result"]


def legend(fmt, labels):
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def unit_formatter(unit):
    def fmt(value, _):
        if unit == "percentunit":
            return f"{value * 100:.0f}%"
        if unit == "s":
            return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"
        if unit in ("reqps", "ops"):
            return f"{value:.0f}/s" if value >= 10 else f"{value:.1f}/s"
        return f"{value:.0f}"
    return FuncFormatter(fmt)


def draw(ax, panel, prometheus, start, end, step, rate_interval):
    ax.set_facecolor(PANEL)
    ax.set_title(panel["title"], color=TEXT, loc="left", fontsize=10, pad=6)
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    stacked = defaults.get("custom", {}).get("stacking", {}).get("mode") == "normal"
    series = []
    for target in panel["targets"]:
        expr = target["expr"].replace("$__rate_interval", rate_interval)
        for result in query_range(prometheus, expr, start, end, step):
            points = [(float(t), float(v)) for t, v in result["values"] if v not in ("NaN", "+Inf")]
            if points:
                series.append((legend(target.get("legendFormat", ""), result["metric"]), points))
    if not series:
        ax.text(0.5, 0.5, "No data", color=TEXT, ha="center", va="center", transform=ax.transAxes)
    times = sorted({t for _, points in series for t, _ in points})
    base = {t: 0.0 for t in times}
    for i, (name, points) in enumerate(sorted(series, key=lambda s: s[0])):
        color = PALETTE[i % len(PALETTE)]
        xs = [datetime.fromtimestamp(t, timezone.utc) for t, _ in points]
        if stacked:
            lows = [base[t] for t, _ in points]
            highs = [base[t] + v for t, v in points]
            for t, v in points:
                base[t] += v
            ax.fill_between(xs, lows, highs, color=color, alpha=0.6, linewidth=0, label=name)
        else:
            ax.plot(xs, [v for _, v in points], color=color, linewidth=1.3, label=name)
    ax.yaxis.set_major_formatter(unit_formatter(defaults.get("unit", "short")))
    if "min" in defaults:
        ax.set_ylim(bottom=defaults["min"])
        if not any(v for _, points in series for _, v in points):
            ax.set_ylim(top=defaults["min"] + 1)  # all zero: a flat line at the bottom
    if "max" in defaults:
        ax.set_ylim(top=defaults["max"] * 1.05)
    ax.xaxis.set_major_formatter(matplotlib.dates.DateFormatter("%H:%M:%S"))
    ax.tick_params(colors=TEXT, labelsize=7)
    ax.grid(color=GRID, linewidth=0.6)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    if series:
        ax.legend(loc="upper left", fontsize=7, ncol=3, frameon=False, labelcolor=TEXT)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--end", type=float, required=True)
    parser.add_argument("--step", default="2s")
    parser.add_argument("--rate-interval", default="10s")
    parser.add_argument("--dashboard", default="docs/grafana-dashboard.json")
    parser.add_argument("--out", default="docs/grafana-dashboard.png")
    args = parser.parse_args()
    dashboard = json.load(open(args.dashboard))
    panels = dashboard["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    width_px, header_px = 1600, 50
    height_px = rows * ROW_PX * 1.25 + header_px
    fig = plt.figure(figsize=(width_px / 100, height_px / 100), dpi=100, facecolor=BACKGROUND)
    fig.text(0.01, 1 - 20 / height_px, dashboard["title"], color=TEXT, fontsize=14, va="top")
    pad_x, pad_top, pad_bottom = 0.035, 0.035, 0.03
    for panel in panels:
        g = panel["gridPos"]
        left = g["x"] / COLUMNS
        width = g["w"] / COLUMNS
        top = 1 - header_px / height_px - (g["y"] / rows) * (1 - header_px / height_px)
        height = (g["h"] / rows) * (1 - header_px / height_px)
        ax = fig.add_axes([left + pad_x, top - height + pad_bottom, width - pad_x - 0.008,
                           height - pad_top - pad_bottom])
        draw(ax, panel, args.prometheus, args.start, args.end, args.step, args.rate_interval)
    fig.savefig(args.out, facecolor=BACKGROUND)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
