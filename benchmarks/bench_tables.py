"""Markdown tables for BENCHMARKS.md from `convtune bench` and `convtune bench-model` JSON results.

Usage:
    python benchmarks/bench_tables.py RESULTS.json [--layers a,b,...]   # every pass of every layer
    python benchmarks/bench_tables.py RESULTS.json --round-trips         # one row per layer: its round trip
    python benchmarks/bench_tables.py --models BENCH-MODEL.json ...      # training steps, a row per convtune mode
"""

import argparse
import json


def _row(cells):
    print("| " + " | ".join(cells) + " |")


def passes_table(doc, wanted):
    peers = [p for p, v in doc["peers"].items() if v["available"]]
    head = ["layer", "pass", "convtune plan", "convtune ms", "error"] + [f"{p} ms" for p in peers] + \
           [f"speedup vs {p}" for p in peers]
    _row(head)
    print("|" + "---|" * len(head))
    for entry in doc["layers"]:
        if wanted and entry["name"] not in wanted:
            continue
        for pass_, rec in entry["passes"].items():
            c = rec["convtune"]
            ms = [rec["peers"][p].get("median_ms") for p in peers]
            row = [entry["name"], pass_, f"`{c.get('plan', 'FAILED')}`", f"{c.get('median_ms', float('nan')):.3f}",
                   f"{c['error']:.1e}" if c.get("error") is not None else "-"]
            row += [f"{m:.3f}" if m else "-" for m in ms]
            row += [f"{m / c['median_ms']:.2f}x" if m and c.get("median_ms") else "-" for m in ms]
            _row(row)
        kept = entry.get("kept_spectra") or {}
        if kept.get("median_ms") is not None:
            row = [entry["name"], "kept spectra" + ("" if kept["pays"] else " (not used)"), f"`{kept['plan']}`",
                   f"{kept['median_ms']:.3f}", f"{max(kept['errors'].values()):.1e}"]
            _row(row + [""] * (2 * len(peers)))
        rt = entry.get("round_trip")
        if rt:
            plan = f"`{entry['round_trip_plan']}`" if entry.get("round_trip_plan") else "per-pass plans"
            row = [entry["name"], "**round trip**", plan, f"**{rt['convtune']:.3f}**", ""]
            row += [f"{rt[p]:.3f}" if rt.get(p) else "-" for p in peers]
            row += [f"**{rt[p] / rt['convtune']:.2f}x**" if rt.get(p) and rt.get("convtune") else "-" for p in peers]
            _row(row)


def round_trips_table(doc, wanted):
    """One row per layer: convtune's round trip (forward + both gradients) against each peer's."""
    peers = [p for p, v in doc["peers"].items() if v["available"]]
    head = ["layer", "convtune round trip ms", "plan"] + [f"{p} ms (speedup)" for p in peers]
    _row(head)
    print("|" + "---|" * len(head))
    for entry in doc["layers"]:
        rt = entry.get("round_trip")
        if not rt or (wanted and entry["name"] not in wanted):
            continue
        plan = f"`{entry['round_trip_plan']}`" if entry.get("round_trip_plan") else "per-pass plans"
        cells = [f"{rt[p]:.3f} ({rt[p] / rt['convtune']:.2f}x)" if rt.get(p) and rt.get("convtune") else "-"
                 for p in peers]
        _row([entry["name"], f"{rt['convtune']:.3f}" if rt.get("convtune") else "FAILED", plan] + cells)


#: The PyTorch mode each convtune mode is held to in the models table (its own numerics and layout).
PEER_OF = {"convtune-fp32": "torch-fp32", "convtune-tf32": "torch-tf32", "convtune-amp-bf16": "torch-amp-bf16",
           "convtune-fp32-kept": "torch-fp32", "convtune-fp32-perpass": "torch-fp32", "convtune-fp32-native": "torch-fp32"}


def models_table(paths):
    """One row per convtune mode of each `convtune bench-model` document, against its PyTorch peer: both step
    times, the ratio of the medians and, for interleaved runs, round by round (median and range); with
    `--null`, PyTorch's ratio to itself; the layers handed back to PyTorch, tuning and first-step times."""
    from convtune.bench.steps import AGAIN, paired, speedups
    head = ["model", "input", "mode", "PyTorch ms", "convtune ms", "vs PyTorch", "round by round",
            "PyTorch vs itself", "layers handed back", "tuning s", "first step s (PyTorch / convtune)"]
    _row(head)
    print("|" + "---|" * len(head))
    for path in paths:
        doc = json.load(open(path))
        modes = {m["mode"]: m for m in doc["modes"]}
        ratios, rounds = speedups(doc), paired(doc)
        for name, ours in modes.items():
            peer_name = PEER_OF.get(name)
            if peer_name is None or peer_name not in modes or "step_ms" not in ours:
                continue
            peer, key = modes[peer_name], f"{name} vs {peer_name}"
            null = ratios.get(f"{peer_name}{AGAIN} vs {peer_name}")
            by_round = rounds.get(key)
            tuning = ours.get("tuning") or {}
            _row([doc["model"], "x".join(map(str, doc["input_shape"])), name, f"{peer['step_ms']:.2f}",
                  f"{ours['step_ms']:.2f}", f"**{ratios[key]:.2f}x**" if key in ratios else "-",
                  f"{by_round[0]:.2f}x ({by_round[1]:.2f}x to {by_round[2]:.2f}x)" if by_round else "-",
                  f"{null:.2f}x" if null else "-",
                  f"{tuning['handed_back']} of {ours.get('patched_layers', '?')}" if "handed_back" in tuning else "-",
                  f"{tuning['seconds']:.1f} ({tuning['tuned']} tuned)" if tuning else "-",
                  f"{peer.get('first_step_s', float('nan')):.2f} / {ours.get('first_step_s', float('nan')):.2f}"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="*")
    parser.add_argument("--layers", default=None)
    parser.add_argument("--round-trips", action="store_true", help="one row per layer: its round trip")
    parser.add_argument("--models", action="store_true", help="the files are bench-model documents")
    args = parser.parse_args()
    if args.models:
        models_table(args.results)
        return
    (path,) = args.results
    doc = json.load(open(path))
    wanted = set(args.layers.split(",")) if args.layers else None
    (round_trips_table if args.round_trips else passes_table)(doc, wanted)


if __name__ == "__main__":
    main()
