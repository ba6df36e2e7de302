"""``python -m bench.suite {list,fetch [names...]}``: the offline benchmark suite's datasets."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from bench.suite import REGISTRY, DatasetFetchError, available, cache_dir, fetch, load


def table(names: Sequence[str] | None = None) -> str:
    """A Markdown table of the suite; sizes for the datasets that are cached."""
    rows = [
        "| name | task | modality | half | n_train / n_test | d | k (or m) | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names or list(REGISTRY):
        spec = REGISTRY[name]
        if available(name):
            ds = load(name)
            sizes = f"{ds.x_train.shape[0]:,} / {ds.x_test.shape[0]:,}"
            d, k = str(ds.x_train.shape[1]), str(ds.n_outputs)
        else:
            sizes, d, k = "(not fetched)", "", ""
        rows.append(f"| {name} | {spec.task} | {spec.modality} | {spec.half} | {sizes} | {d} | {k} | {spec.source} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the suite as a table (sizes of the cached ones)")
    f = sub.add_parser("fetch", help="convert the named datasets (default: all) into the cache")
    f.add_argument("names", nargs="*", help=f"any of: {', '.join(REGISTRY)}")
    f.add_argument("--force", action="store_true", help="rebuild even when cached")
    f.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    if args.command == "list":
        print(f"cache: {cache_dir()}")
        print(table())
        return 0
    unknown = [n for n in args.names if n not in REGISTRY]
    if unknown:
        p.error(f"unknown dataset(s) {unknown}; known: {', '.join(REGISTRY)}")
    names = args.names or list(REGISTRY)
    t0 = time.perf_counter()
    status = 0
    try:
        timings = fetch(names, progress=not args.quiet, force=args.force)
    except DatasetFetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        timings = {}
        status = 1
    print(f"cache: {cache_dir()}; total {time.perf_counter() - t0:.1f} s")
    for name, secs in timings.items():
        print(f"{name}: {'cached already' if secs == 0.0 else f'{secs:.1f} s'}")
    print(table(names))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
