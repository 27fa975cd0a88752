#!/usr/bin/env python3
"""The seed's error-budget tracker (seeds/error-budget.txt), its approach kept:
a deque of events, pruned on record, and every report scanning every event
(success_count / failure_count are sums over the deque, called several times per
report). Two seed defects are fixed so it can run at all: the non-reentrant lock
(record() deadlocks on its first call) is dropped, this being single-threaded.

Prints report time at the given window sizes on the events bench/budget_bench.c
uses: event i of N at t = i * 86400 / N, a failure when i % 20 == 0.

    python3 bench/peers/budget_scan.py [N ...]
"""
import sys
import time
from collections import deque

WINDOW = 86400.0


class ScanTracker:
    def __init__(self, target=0.95, window=WINDOW, warning=0.50, critical=0.10):
        self.target, self.window = target, window
        self.warning, self.critical = warning, critical
        self.events = deque()
        self.last_status = "healthy"

    def record(self, success, now):
        self.events.append((now, success))
        self.prune(now)
        self.last_status = self.compute_status()

    def prune(self, now):
        cutoff = now - self.window
        while self.events and self.events[0][0] < cutoff:
            self.events.popleft()

    def total(self):
        return len(self.events)

    def successes(self):
        return sum(1 for _, ok in self.events if ok)

    def failures(self):
        return sum(1 for _, ok in self.events if not ok)

    def rate(self):
        t = self.total()
        return self.successes() / t if t else 1.0

    def budget_total(self):
        t = self.total()
        return t * (1 - self.target) if t else 0

    def budget_remaining(self):
        return max(0, self.budget_total() - self.failures())

    def remaining_fraction(self):
        b = self.budget_total()
        if b <= 0:
            return 1.0 if self.failures() == 0 else 0.0
        return max(0, self.budget_remaining() / b)

    def burn_rate(self):
        t = self.total()
        expected = t * (1 - self.target)
        return self.failures() / expected if t and expected else 0.0

    def compute_status(self):
        r = self.remaining_fraction()
        if r <= 0:
            return "exhausted"
        if r < self.critical:
            return "critical"
        if r < self.warning:
            return "warning"
        return "healthy"

    def report(self, now):
        # the seed prunes only in record(); pruning here lets it slide like ours
        self.prune(now)
        self.last_status = self.compute_status()
        return {
            "status": self.last_status,
            "slo_target": self.target,
            "current_rate": round(self.rate(), 4),
            "total_events": self.total(),
            "successes": self.successes(),
            "failures": self.failures(),
            "budget_total": round(self.budget_total(), 1),
            "budget_remaining": round(self.budget_remaining(), 1),
            "budget_remaining_pct": round(self.remaining_fraction() * 100, 1),
            "burn_rate": round(self.burn_rate(), 2),
        }


def bench(n):
    tr = ScanTracker()
    # Filling through record() is O(n^2) here (each record scans for the
    # status): append directly, the events are in time order anyway.
    tr.events.extend((i * WINDOW / n, i % 20 != 0) for i in range(n))
    first = tr.report(WINDOW)
    print(f"check events={n} at=window " + " ".join(f"{k}={v}" for k, v in first.items()))
    reps = max(3, min(2000, 20_000_000 // (n * 8)))
    start = time.perf_counter()
    for i in range(reps):
        r = tr.report(WINDOW + i * 86.4 / reps)
    dt = time.perf_counter() - start
    print(f"report events={n} reps={reps} ns_per_report={dt * 1e9 / reps:.1f} "
          f"status={r['status']} total={r['total_events']}")


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [1000, 100000, 1000000]:
        bench(n)
