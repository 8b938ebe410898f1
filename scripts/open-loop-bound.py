#!/usr/bin/env python3
"""The tail an open-loop shedder gets: an M/G/c FIFO queue fed Poisson arrivals.

A shedder whose admissions do not depend on the upstream's queue (a fixed shed probability,
or many replicas each too small to see the queue in its own in-flight count) turns Poisson
arrivals into Poisson admissions. This simulates the upstream of `tests/proxy/replicas.rs`
(8 workers, service uniform 10-30 ms) at several utilisations and prints the p50 and p99 of
latency (wait plus service), milliseconds: the bound docs/pressure.md "Differs" compares the
16-replica scenario with. Standard library only; seeded, so the figures repeat.

Usage: scripts/open-loop-bound.py [--workers 8] [--requests 400000]
"""
import argparse
import heapq
import random


def run(rho, workers, requests, seed=1):
    rng = random.Random(seed)
    rate = rho * workers / 0.020  # mean service 20 ms
    free = [0.0] * workers
    t = 0.0
    latencies = []
    for _ in range(requests):
        t += rng.expovariate(rate)
        start = max(t, heapq.heappop(free))
        done = start + rng.uniform(0.010, 0.030)
        heapq.heappush(free, done)
        latencies.append(done - t)
    latencies.sort()
    return latencies[len(latencies) // 2] * 1e3, latencies[int(len(latencies) * 0.99)] * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--requests", type=int, default=400_000)
    args = ap.parse_args()
    for rho in (0.85, 0.90, 0.93, 0.95, 0.97):
        p50, p99 = run(rho, args.workers, args.requests)
        print(f"utilisation {rho:.2f}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")


if __name__ == "__main__":
    main()
