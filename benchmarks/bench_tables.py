"""Markdown tables for BENCHMARKS.md from `convtune bench` JSON results.

Usage: python benchmarks/bench_tables.py RESULTS.json [--layers a,b,...]
"""

import argparse
import json


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--layers", default=None)
    args = parser.parse_args()
    doc = json.load(open(args.results))
    wanted = set(args.layers.split(",")) if args.layers else None
    peers = [p for p, v in doc["peers"].items() if v["available"]]
    head = ["layer", "pass", "convtune plan", "convtune ms", "error"] + [f"{p} ms" for p in peers] + \
           [f"speedup vs {p}" for p in peers]
    print("| " + " | ".join(head) + " |")
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
            print("| " + " | ".join(row) + " |")
        kept = entry.get("kept_spectra") or {}
        if kept.get("median_ms") is not None:
            row = [entry["name"], "kept spectra" + ("" if kept["pays"] else " (not used)"), f"`{kept['plan']}`",
                   f"{kept['median_ms']:.3f}", f"{max(kept['errors'].values()):.1e}"]
            print("| " + " | ".join(row + [""] * (2 * len(peers))) + " |")
        rt = entry.get("round_trip")
        if rt:
            plan = f"`{entry['round_trip_plan']}`" if entry.get("round_trip_plan") else "per-pass plans"
            row = [entry["name"], "**round trip**", plan, f"**{rt['convtune']:.3f}**", ""]
            row += [f"{rt[p]:.3f}" if rt.get(p) else "-" for p in peers]
            row += [f"**{rt[p] / rt['convtune']:.2f}x**" if rt.get(p) and rt.get("convtune") else "-" for p in peers]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
