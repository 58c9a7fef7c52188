#!/usr/bin/env python3
"""Where each steady-load object's latency went, stage by stage.

Joins the samples written by `refract-bench --samples FILE` (origin write time and latency of
every steady-load object) with the per-object logs of both agents, run with
`REFRACT_AGENT_LOG_LEVEL=info,refract::trace=debug`:

  local agent:  seen (watch event)  -> sent (on the stream)
  remote agent: recv (off the stream) -> start (apply started) -> applied

Usage: scripts/bench-stages.py SAMPLES LOCAL_LOG REMOTE_LOG [--slow MS] [--skip SECONDS]
Prints p50/p90/p99/max of each stage per kind; with --slow, every object slower than MS.
"""
import argparse
import datetime
import re

STAGES = ["create", "seen", "sent", "recv", "start", "applied", "bench"]
LINE = re.compile(r"^(\S+)Z\s+DEBUG\s+.*?refract::trace:\s+(\w+)\s+name=(\S+)")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def trace_events(paths):
    """name -> stage -> first wall-clock time (ms) the agents logged it."""
    events = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                if "refract::trace" not in line:
                    continue
                m = LINE.match(COLOUR.sub("", line).strip())
                if not m:
                    continue
                at = datetime.datetime.fromisoformat(m.group(1))
                ms = at.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000
                events.setdefault(m.group(3), {}).setdefault(m.group(2), ms)
    return events


def quantile(values, q):
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("samples")
    p.add_argument("local_log")
    p.add_argument("remote_log")
    p.add_argument("--system", default="refract")
    p.add_argument("--slow", type=float, help="list objects slower than this, ms")
    p.add_argument("--skip", type=float, default=5.0, help="unmeasured warm-up, seconds")
    args = p.parse_args()
    events = trace_events([args.local_log, args.remote_log])
    by_kind = {}
    with open(args.samples) as f:
        for line in f:
            system, kind, name, written, latency = line.split()
            if system == args.system:
                by_kind.setdefault(kind, []).append((float(written), name, float(latency)))
    for kind, rows in by_kind.items():
        rows.sort()
        first = rows[0][0]
        rows = [r for r in rows if r[0] - first >= args.skip * 1000]
        stages = {}
        slow = []
        for written, name, latency in rows:
            at = dict(events.get(name, {}), create=written, bench=written + latency)
            spans = []
            for a, b in zip(STAGES, STAGES[1:]):
                d = at[b] - at[a] if a in at and b in at else None
                if d is not None:
                    stages.setdefault(f"{a} -> {b}", []).append(d)
                spans.append(d)
            if args.slow is not None and latency > args.slow:
                slow.append(((written - first) / 1000, name, latency, spans))
        print(f"{kind}: {len(rows)} objects")
        for stage, values in stages.items():
            values.sort()
            print(
                f"  {stage:18} p50 {quantile(values, .5):7.2f}  p90 {quantile(values, .9):7.2f}"
                f"  p99 {quantile(values, .99):7.2f}  max {values[-1]:7.2f} ms"
            )
        if slow:
            header = " ".join(f"{b:>7}" for b in STAGES[1:])
            print(f"  {'sent at':7} {'name':14} {'latency':10} | ms until {header}")
        for second, name, latency, spans in slow:
            cells = " ".join("   -   " if d is None else f"{d:7.1f}" for d in spans)
            print(f"  {second:6.2f}s {name:14} {latency:7.1f} ms | {cells}")


if __name__ == "__main__":
    main()
