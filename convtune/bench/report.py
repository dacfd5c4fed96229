"""``convtune report``: figures and a small HTML page from ``convtune bench`` results.

* a speedup heat map over kernel size x input size for the synthetic sweep,
  green where convtune is faster than the peer, red where it is slower;
* a per-layer bar chart: convtune's speedup over each peer (a ratio, on a linear axis from zero,
  with 1 marked), or convtune's times where no peer ran;
* an HTML page with every pass of every layer (and of the sweep) and each round trip.

matplotlib is an optional extra (``pip install 'convtune[report]'``).
"""

from __future__ import annotations

import html
import json
import math
import re
import textwrap
from pathlib import Path

from ..errors import ConvtuneError
from .runner import FORMAT

PEER_ORDER = ("torch-fp32", "torch-tf32", "torch-fp32-ref", "torch-fft", "cudnn-best")
COLOURS = {"convtune": "#1b7837", "torch-fp32": "#2166ac", "torch-tf32": "#67a9cf", "torch-fp32-ref": "#92c5de",
           "torch-fft": "#762a83",
           "cudnn-best": "#b2182b"}


def load_results(path) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ConvtuneError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ConvtuneError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConvtuneError(f"{path} is not a convtune bench results file (expected \"format\": \"{FORMAT}\")")
    return doc


#: Per-pass parity: a pass counts as at PyTorch's speed when it takes at most this multiple of PyTorch's time
#: (the issues' per-pass targets).
PARITY_BOUND = 1.03


def parity(results: dict, peer: str = "torch-fp32", bound: float = PARITY_BOUND) -> dict:
    """How many of a bench run's passes (its layers', not the sweep's) take at most ``bound`` times ``peer``'s
    time, for convtune's array call (``convtune``) and the PyTorch layer (``drop-in``): per contender
    ``{"within": n, "passes": m, "paired": k, "below": [(layer, pass, peer / contender), ...], "null": {...},
    "noise": {...}}``; passes where either side has no time are left out. Where the pass was also timed side by
    side with that peer (the record's ``paired``, for the contender it names), the paired ratio decides; ``paired``
    counts those passes, ``null`` holds their peer's ratio to itself (``{(layer, pass): ratio}``, where measured)
    and ``noise`` those of the passes below whose peer's ratio to itself is at least as far from 1 as theirs
    (reported, not counted as within).

    Examples
    --------
    >>> rec = {"peers": {"torch-fp32": {"median_ms": 1.0}}, "convtune": {"median_ms": 1.1},
    ...        "drop_in": {"median_ms": 0.9}}
    >>> parity({"layers": [{"name": "l", "passes": {"fwd": rec}}]})["convtune"]["below"]
    [('l', 'fwd', 0.909)]
    """
    out = {}
    for name, key in (("convtune", "convtune"), ("drop-in", "drop_in")):
        within, passes, below, paired, null = 0, 0, [], 0, {}
        for entry in results.get("layers") or []:
            for pass_, rec in entry["passes"].items():
                pair = rec.get("paired") or {}
                if pair.get("contender") == name and pair.get("peer") == peer and pair.get("ratio"):
                    ratio = pair["ratio"]
                    paired += 1
                    if pair.get("null_ratio"):
                        null[entry["name"], pass_] = round(pair["null_ratio"], 3)
                else:
                    theirs = (rec.get("peers", {}).get(peer) or {}).get("median_ms")
                    ours = (rec.get(key) or {}).get("median_ms")
                    if not theirs or not ours:
                        continue
                    ratio = theirs / ours
                passes += 1
                if ratio >= 1 / bound:
                    within += 1
                else:
                    below.append((entry["name"], pass_, round(ratio, 3)))
        # the passes below whose peer, timed against itself in the same run, came out at least as far from 1
        noise = {(layer, pass_): null[layer, pass_] for layer, pass_, ratio in below
                 if (layer, pass_) in null and abs(1 - null[layer, pass_]) >= abs(1 - ratio)}
        out[name] = {"within": within, "passes": passes, "paired": paired, "below": below, "null": null,
                     "noise": noise}
    return out


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        raise ConvtuneError("convtune report needs matplotlib: pip install 'convtune[report]'") from None


def entry_times(entry: dict) -> tuple[dict, str]:
    """Round-trip times per contestant, else the single pass's; and which it is."""
    if entry.get("round_trip"):
        return entry["round_trip"], "round trip"
    (pass_, rec), = list(entry["passes"].items())[:1]
    times = {"convtune": rec["convtune"].get("median_ms")}
    times.update({n: r.get("median_ms") for n, r in rec["peers"].items()})
    return times, pass_


def best_peer(results: dict) -> str | None:
    """The first available peer in preference order (the strict-fp32 one first)."""
    for name in PEER_ORDER:
        if results["peers"].get(name, {}).get("available"):
            return name
    return None


def heatmap(results: dict, out: Path, plt) -> list[Path]:
    cells = results.get("sweep") or []
    if not cells:
        return []
    peer = best_peer(results)
    groups: dict[str, dict] = {}
    for c in cells:
        m = re.match(r"sweep-k(\d+)-i(\d+)-(c\d+-b\d+)", c["name"])
        if m:
            groups.setdefault(m.group(3), {})[(int(m.group(1)), int(m.group(2)))] = c
    files = []
    from matplotlib.colors import TwoSlopeNorm
    for setting, grid in groups.items():
        kernels = sorted({k for k, _ in grid})
        inputs = sorted({n for _, n in grid})
        values = [[math.nan] * len(inputs) for _ in kernels]
        what = ""
        for (k, n), c in grid.items():
            times, what = entry_times(c)
            if peer:
                ours, theirs = times.get("convtune"), times.get(peer)
                v = math.log2(theirs / ours) if ours and theirs else math.nan
            else:
                v = times.get("convtune") or math.nan
            values[kernels.index(k)][inputs.index(n)] = v
        fig, ax = plt.subplots(figsize=(1.3 * len(inputs) + 2.5, 0.8 * len(kernels) + 2))
        finite = [v for row in values for v in row if math.isfinite(v)]
        if peer:
            span = max(1.0, max((abs(v) for v in finite), default=1.0))
            im = ax.imshow(values, cmap="RdYlGn", norm=TwoSlopeNorm(0.0, -span, span), origin="lower", aspect="auto")
            bar = fig.colorbar(im, ax=ax)
            ticks = [t for t in range(-int(span), int(span) + 1)]
            bar.set_ticks(ticks)
            bar.set_ticklabels([f"{2 ** t:g}x" for t in ticks])
            bar.set_label(f"speedup over {peer} ({what}); green: convtune faster")
            title = f"convtune vs {peer}, {what}, {results['math']}"
        else:
            im = ax.imshow(values, cmap="viridis", origin="lower", aspect="auto")
            fig.colorbar(im, ax=ax).set_label(f"convtune time, ms ({what})")
            title = f"convtune {what} time, {results['math']} (no peer on this machine)"
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if math.isfinite(v):
                    ax.text(j, i, f"{2 ** v:.2f}x" if peer else f"{v:.2g}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(inputs)), [str(n) for n in inputs])
        ax.set_yticks(range(len(kernels)), [str(k) for k in kernels])
        ax.set_xlabel("input size (square)")
        ax.set_ylabel("kernel size (square)")
        ax.set_title(f"{title}\n{results['device'].get('model', '')}, {setting}", fontsize=10)
        fig.tight_layout()
        path = out / f"heatmap-{setting}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        files.append(path)
    return files


def layer_figure(results: dict, plt):
    """The per-layer chart, or ``None`` without layers: with peers, convtune's speedup over each
    (peer time / convtune time, a ratio on a linear axis from zero, 1 marked); without them,
    convtune's times in ms on a linear axis from zero."""
    layers = results.get("layers") or []
    if not layers:
        return None
    peers = [p for p in PEER_ORDER if results["peers"].get(p, {}).get("available")]
    names = peers or ["convtune"]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(layers) + 2), 5))
    what = ""
    for i, name in enumerate(names):
        xs, ys = [], []
        for j, entry in enumerate(layers):
            times, what = entry_times(entry)
            ours, theirs = times.get("convtune"), times.get(name)
            value = (theirs / ours if ours and theirs else None) if peers else ours
            if value:
                xs.append(j + (i - (len(names) - 1) / 2) * width)
                ys.append(value)
        if xs:  # (a peer with no figure on any layer gets no bars, and so no entry in the legend)
            ax.bar(xs, ys, width, label=f"vs {name}" if peers else name, color=COLOURS.get(name))
    ax.set_yscale("linear")
    ax.set_ylim(bottom=0)
    if peers:
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="same speed")
        label = f"convtune's speedup over the peer, {what} (x; above 1: convtune faster)"
    else:
        label = f"convtune {what} time, ms (lower is better)"
    ax.set_ylabel("\n".join(textwrap.wrap(label, 45)))  # (wrapped: one line would run past the figure's height)
    ax.set_xticks(range(len(layers)), [e["name"] for e in layers], rotation=60, ha="right", fontsize=8)
    absent = [p for p in PEER_ORDER if not results["peers"].get(p, {}).get("available")]
    note = f"\nabsent peers: {', '.join(absent)} (see index.html)" if absent else ""
    title = "speedup per layer" if peers else "time per layer"
    ax.set_title(f"{title} ({what}), {results['math']}, {results['device'].get('model', '')}{note}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def layer_bars(results: dict, out: Path, plt) -> list[Path]:
    fig = layer_figure(results, plt)
    if fig is None:
        return []
    path = out / "layers.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


def _pass_rows(entries, peers) -> str:
    """Table rows: every pass of every entry, then its round trip, with each peer's time and ratio."""
    e = html.escape
    rows = []

    def row(name, what, plan, ours, theirs):
        cells = [f"<td>{e(name)}</td>", f"<td>{e(what)}</td>", f"<td>{e(plan)}</td>",
                 f"<td>{ours:.3f}</td>" if ours else "<td>failed</td>"]
        for t in theirs:
            cells.append(f"<td>{t:.3f} ({t / ours:.2f}x)</td>" if t and ours else "<td>-</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    for entry in entries:
        for pass_, rec in entry["passes"].items():
            c = rec["convtune"]
            row(entry["name"], pass_, c.get("plan", c.get("failed", "")), c.get("median_ms"),
                [rec["peers"].get(p, {}).get("median_ms") for p in peers])
        if entry.get("round_trip"):
            rt = entry["round_trip"]
            row(entry["name"], "round trip", entry.get("round_trip_plan", "the per-pass plans"), rt.get("convtune"),
                [rt.get(p) for p in peers])
    return "".join(rows)


def write_html(results: dict, images: list[Path], out: Path) -> Path:
    e = html.escape
    peers = [p for p in PEER_ORDER if p in results["peers"]]
    head = ("<tr><th>layer</th><th>pass</th><th>convtune plan</th><th>convtune ms</th>" +
            "".join(f"<th>{e(p)} ms (its time / convtune's)</th>" for p in peers) + "</tr>")
    sections = []
    for key, title in (("layers", "Layers"), ("sweep", "Synthetic sweep")):
        entries = results.get(key) or []
        if entries:  # no empty section
            sections.append(f"<h2>{title}: every pass, and the round trip</h2><table>{head}"
                            f"{_pass_rows(entries, peers)}</table>")
    absent = "".join(f"<li>{e(p)}: {e(v['reason'])}</li>" for p, v in results["peers"].items() if not v["available"])
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>convtune benchmark</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:3px 8px;text-align:right}}td:first-child,td:nth-child(2),td:nth-child(3){{text-align:left}}</style></head><body>
<h1>convtune benchmark{'' if results.get('complete', True) else ' (incomplete run: cut off before the end)'}</h1>
<p>{e(results['device'].get('model', ''))} &middot; {e(results['date'])} &middot; math mode {e(results['math'])}<br>
command: <code>{e(results['command'])}</code><br>device key: <code>{e(results['device_key'])}</code><br>
times are medians in ms; a ratio above 1 means convtune is faster than that peer</p>
{'<p>absent peers:</p><ul>' + absent + '</ul>' if absent else ''}
{''.join(f'<p><img src="{e(p.name)}" alt="{e(p.stem)}"></p>' for p in images)}
{''.join(sections) or '<p>no layers were measured</p>'}
</body></html>
"""
    path = out / "index.html"
    path.write_text(doc)
    return path


def make_report(results_path, out_dir) -> list[Path]:
    results = load_results(results_path)
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images = heatmap(results, out, plt) + layer_bars(results, out, plt)
    return images + [write_html(results, images, out)]
