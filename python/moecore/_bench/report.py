"""Output of python -m moecore bench: a Markdown table (default), CSV, JSON and a PNG chart."""

from __future__ import annotations

import csv
import io
import json

PEER_LABELS = {"torch_eager_bf16": "eager bf16", "torch_eager_f32": "eager f32",
               "torch_grouped_mm_bf16": "grouped_mm bf16"}


def machine_lines(machine: dict, header: dict) -> list:
    lines = [f"- {key}: {value}" for key, value in header.items()]
    for t, probe in machine["threads"].items():
        streams = f"{probe['streams']} stream{'s' if probe['streams'] > 1 else ''}/thread"
        lines.append(f"- {t} thread{'s' if t > 1 else ''}: read bandwidth {probe['gb_per_s']:.1f} "
                     f"GB/s (best with {streams}), peak {probe['gflop_per_s']:.0f} GFLOP/s "
                     f"({machine['peak_kind']})")
    return lines


def markdown_header(peers: list) -> str:
    cols = ["shape", "format (backend)", "M", "thr", "kernel", "ms", "GB/s", "% BW", "GFLOP/s",
            "% peak", "% bound"] + [f"{PEER_LABELS[p]} ms (×)" for p in peers]
    align = ["---"] * 5 + ["---:"] * (len(cols) - 5)
    return "| " + " | ".join(cols) + " |\n| " + " | ".join(align) + " |"


def markdown_row(row: dict, peers: list) -> str:
    cells = [row["shape"], f"{row['format']} ({row['backend']})", str(row["tokens"]),
             str(row["threads"]), row["kernel"], f"{row['ms']:.3f}", f"{row['gb_per_s']:.1f}",
             f"{row['pct_bandwidth']:.0f}", f"{row['gflop_per_s']:.1f}", f"{row['pct_peak']:.1f}",
             f"{row['pct_bound']:.0f}"]
    for p in peers:
        ms = row[f"{p}_ms"]
        cells.append(row[f"{p}_note"] if ms is None else f"{ms:.2f} ({row[f'{p}_speedup']:.1f}×)")
    return "| " + " | ".join(cells) + " |"


def to_csv(rows: list) -> str:
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return buf.getvalue()


def to_json(rows: list, machine: dict, header: dict, skipped: list) -> str:
    machine = {"peak_kind": machine["peak_kind"],
               "threads": {str(t): v for t, v in machine["threads"].items()}}
    return json.dumps({"header": header, "machine": machine, "rows": rows, "skipped": skipped},
                      indent=1)


def chart(rows: list, path: str) -> None:
    """One panel per shape: % of bound against M, a line per format (most threads run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    formats = list(dict.fromkeys(r["format"] for r in rows))  # one colour per format, every panel
    threads = max(r["threads"] for r in rows)
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 3.8), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for fmt in dict.fromkeys(r["format"] for r in rows if r["shape"] == shape):
            pts = sorted((r["tokens"], r["pct_bound"]) for r in rows
                         if r["shape"] == shape and r["format"] == fmt and r["threads"] == threads)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=fmt,
                    color=f"C{formats.index(fmt) % 10}")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{shape} ({threads} threads)")
        ax.set_xlabel("tokens M")
        ax.set_ylabel("% of bound")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
