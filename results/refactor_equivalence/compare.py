"""Compare two runs' metrics.jsonl step by step, ignoring time/* and perf/* (and keys only one run has)."""
import json
import sys

a, b = ([json.loads(x) for x in open(f"{d}/metrics.jsonl")] for d in sys.argv[1:3])
diffs = [(x["step"], k) for x, y in zip(a, b) for k in x.keys() & y.keys()
         if not k.startswith(("time/", "perf/")) and x[k] != y[k]]
print(f"{len(a)} vs {len(b)} steps; keys only in {sys.argv[2]}: {sorted(b[0].keys() - a[0].keys())}; "
      f"differences outside time/* and perf/*: {diffs or 'none'}")
