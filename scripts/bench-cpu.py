#!/usr/bin/env python3
"""CPU of the benchmark's processes, sampled from /proc, averaged over its latency windows.

  scripts/bench-cpu.py sample FILE            # every 0.25 s until stopped (run beside the bench)
  scripts/bench-cpu.py windows FILE SAMPLES   # SAMPLES: refract-bench --samples output

`windows` prints, for each system and kind of its steady load, how busy the machine was (cores,
and cores in iowait) and each process's cores, over the measured part of the window.
"""
import argparse
import os
import time

WATCHED = {
    "etcd", "kube-apiserver", "kube-controller", "kube-scheduler",
    "local-agent", "remote-agent", "direct-copier", "refract-bench",
}
HZ = os.sysconf("SC_CLK_TCK")


def processes():
    """pid -> (name, utime + stime in clock ticks) of the watched processes."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        if name in WATCHED:
            fields = stat[stat.rindex(")") + 2:].split()
            found[pid] = (name, int(fields[11]) + int(fields[12]))
    return found


def sample(path):
    with open(path, "w") as out:
        while True:
            with open("/proc/stat") as f:
                machine = f.readline().split()[1:]
            procs = " ".join(f"{n}:{p}:{t}" for p, (n, t) in processes().items())
            out.write(f"{time.time():.3f} {' '.join(machine)} | {procs}\n")
            out.flush()
            time.sleep(0.25)


def read(path):
    rows = []
    with open(path) as f:
        for line in f:
            head, procs = line.split(" | ")
            fields = head.split()
            ticks = {}
            for item in procs.split():
                name, pid, t = item.split(":")
                ticks[f"{name}:{pid}"] = int(t)
            machine = [int(x) for x in fields[1:] if x.isdigit()]
            rows.append((float(fields[0]), machine, ticks))
    return rows


def windows(path, samples, skip):
    rows = read(path)
    spans = {}
    with open(samples) as f:
        for line in f:
            system, kind, name, written, _ = line.split()
            # One window per latency round: `lat-cm-r2-17` is round 2's.
            parts = name.split("-")
            if len(parts) > 3 and parts[2].startswith("r"):
                kind = f"{kind} round {parts[2][1:]}"
            spans.setdefault((system, kind), []).append(float(written) / 1000)
    for (system, kind), times in spans.items():
        start, end = min(times) + skip, max(times)
        inside = [r for r in rows if start <= r[0] <= end]
        if len(inside) < 2:
            print(f"{system} {kind}: no CPU samples in the window")
            continue
        (t0, m0, p0), (t1, m1, p1) = inside[0], inside[-1]
        seconds = t1 - t0
        delta = [b - a for a, b in zip(m0, m1)]
        idle, iowait = delta[3], delta[4]
        busy = (sum(delta) - idle - iowait) / HZ / seconds
        cores = {k: (v - p0[k]) / HZ / seconds for k, v in p1.items() if k in p0}
        listed = " ".join(f"{k}={v:.2f}" for k, v in sorted(cores.items()) if v > 0)
        print(f"{system} {kind}: busy {busy:.2f} cores, iowait {iowait / HZ / seconds:.2f}; {listed}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample")
    s.add_argument("file")
    w = sub.add_parser("windows")
    w.add_argument("file")
    w.add_argument("samples")
    w.add_argument("--skip", type=float, default=5.0, help="unmeasured warm-up, seconds")
    args = p.parse_args()
    if args.command == "sample":
        sample(args.file)
    else:
        windows(args.file, args.samples, args.skip)


if __name__ == "__main__":
    main()
