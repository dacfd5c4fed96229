"""Markdown tables for BENCHMARKS.md from `convtune bench` and `convtune bench-model` JSON results.

Usage:
    python benchmarks/bench_tables.py RESULTS.json [--layers a,b,...]   # every pass of every layer
    python benchmarks/bench_tables.py RESULTS.json --round-trips         # one row per layer: its round trip
    python benchmarks/bench_tables.py --models BENCH-MODEL.json ...      # training steps, one row per model
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


def models_table(paths):
    """One row per `convtune bench-model` document: step times of every mode and convtune's speedups."""
    head = ["model", "input", "PyTorch fp32 ms", "PyTorch TF32 ms", "PyTorch AMP bf16 CL ms", "convtune fp32 ms",
            "vs fp32", "vs TF32", "vs AMP", "first step s (PyTorch fp32 / convtune)", "tuning s",
            "peak GiB (PyTorch fp32 / convtune)"]
    _row(head)
    print("|" + "---|" * len(head))
    for path in paths:
        doc = json.load(open(path))
        modes = {m["mode"]: m for m in doc["modes"]}
        ours = modes.get("convtune-fp32", {})

        def ms(name):
            return modes.get(name, {}).get("step_ms")

        def ratio(name):
            return f"**{ms(name) / ours['step_ms']:.2f}x**" if ms(name) and ours.get("step_ms") else "-"

        def gib(mode):
            mem = mode.get("peak_memory_bytes")
            return f"{mem / 2 ** 30:.2f}" if mem else "-"
        fp32 = modes.get("torch-fp32", {})
        first = f"{fp32.get('first_step_s', float('nan')):.2f} / {ours.get('first_step_s', float('nan')):.2f}"
        tuning = ours.get("tuning", {})
        _row([doc["model"], "x".join(map(str, doc["input_shape"]))] +
             [f"{ms(m):.2f}" if ms(m) else "-" for m in ("torch-fp32", "torch-tf32", "torch-amp-bf16",
                                                          "convtune-fp32")] +
             [ratio("torch-fp32"), ratio("torch-tf32"), ratio("torch-amp-bf16"), first,
              f"{tuning['seconds']:.1f} ({tuning['tuned']} tuned)" if tuning else "-",
              f"{gib(fp32)} / {gib(ours)}"])


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
