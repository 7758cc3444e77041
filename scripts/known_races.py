#!/usr/bin/env python3
"""Decide whether failed `go test` packages failed only on rocketmq-client-go's
own data races (apache/rocketmq-client-go#790, #1115: rmqClient.Shutdown
writes c.close while pull and rebalance goroutines read it).

Reads a `go test` log (package-list mode). For each failed package it prints
one line, "<import path> <-run pattern of its failed top-level tests>", and
exits 0 when every failed package qualifies: it has at least one race report,
and in every report both conflicting accesses have their top frame inside
rocketmq-client-go. Exits 1 otherwise (a real failure, or a race in rmqtx's
own code), 2 on usage errors.
"""
import re
import sys

CLIENT = "github.com/apache/rocketmq-client-go/"
END = re.compile(r"^(ok|FAIL|\?)\s+(\S+)(\s|$)")
ACCESS = re.compile(r"^(Read|Write|Previous read|Previous write|Atomic read|Atomic write) at ")


def reports(lines):
    """Yields, per race report, the top frames of its two accesses."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("WARNING: DATA RACE"):
            tops = []
            j = i + 1
            while j < len(lines) and not lines[j].startswith("=================="):
                if ACCESS.match(lines[j]) and j + 1 < len(lines):
                    tops.append(lines[j + 1].strip())
                j += 1
            yield tops
            i = j
        i += 1


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], errors="replace") as f:
        lines = f.read().splitlines()
    block, failed, ok = [], [], True
    failtest = re.compile(r"^--- FAIL: (\S+) ")
    for line in lines:
        m = END.match(line)
        if not m:
            block.append(line)
            continue
        if m.group(1) == "FAIL" and "/" in m.group(2):
            pkg = m.group(2)
            tests = sorted({t.group(1) for t in map(failtest.match, block) if t})
            if not tests:
                ok = False
            failed.append(pkg + " ^(" + "|".join(re.escape(t) for t in tests) + ")$")
            races = list(reports(block))
            broken = any(l.startswith("panic:") or "[build failed]" in l or "[setup failed]" in l for l in block)
            client_only = races and all(len(t) >= 2 and all(CLIENT in f for f in t) for t in races)
            if broken or not client_only:
                ok = False
        block = []
    for line in failed:
        print(line)
    return 0 if failed and ok else 1


if __name__ == "__main__":
    sys.exit(main())
