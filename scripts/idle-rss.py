#!/usr/bin/env python3
"""Memory held by idle keep-alive connections, the issue-14 measurement.

Opens N client connections to a proxy on 127.0.0.1, sends one request on each (the shared
harness's 312-byte vehicle.position POST) and reads its answer, then leaves every connection
open and idle. Reports the RSS of the proxy's processes (the PIDs given and their children)
before, with the N idle connections (after `--hold` seconds idle, default 15: the allocator
returns the opening burst's pages over the first ten seconds or so, 28-30 MiB at 5 s settling
to 23-24 MiB for shedgate), and `--after` seconds (default 5) after they have all closed.

Usage: scripts/idle-rss.py --port 18083 --pid PID [--conns 10000] [--hold 15] [--after 5]
Loopback only; bounded in count (N) and time (a 120 s deadline per phase).
"""

import argparse
import asyncio
import os
import time

BODY = (
    b'{"device_id":"veh-0042","fleet_id":"fleet-berlin-07","lat":52.520008,"lon":13.404954,'
    b'"occurred_at":"2026-11-29T12:00:00Z","speed_kmh":41.5,"heading_deg":187.0,'
    b'"odometer_km":128734.2,"battery_pct":76,"ignition":true,"driver_id":"drv-1187",'
    b'"trip_id":"trip-20261129-0042-03","seq":981234,"source":"telematics-gw-3"}'
)


def request(port):
    return (
        b"POST /ingest HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"X-Stream: vehicle.position\r\nContent-Length: %d\r\n\r\n" % (port, len(BODY))
    ) + BODY


def rss_kib(pids):
    """Sum of VmRSS over the PIDs and their children, KiB."""
    seen, todo, total = set(), list(pids), 0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            pass
    return total


async def one(port, req):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(req)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    if length:
        await reader.readexactly(length)
    if not head.startswith(b"HTTP/1.1 2"):
        raise RuntimeError(head.split(b"\r\n")[0])
    return writer


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, action="append", required=True)
    ap.add_argument("--conns", type=int, default=10000)
    ap.add_argument("--after", type=float, default=5.0, help="seconds to wait after the close")
    ap.add_argument("--hold", type=float, default=15.0, help="seconds idle before the RSS is read")
    a = ap.parse_args()
    req = request(a.port)
    before = rss_kib(a.pid)
    writers = []
    sem = asyncio.Semaphore(256)

    async def opened():
        async with sem:
            writers.append(await one(a.port, req))

    await asyncio.wait_for(asyncio.gather(*(opened() for _ in range(a.conns))), 120)
    await asyncio.sleep(a.hold)
    idle = rss_kib(a.pid)
    for w in writers:
        w.close()
    await asyncio.wait_for(asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True), 120)
    time.sleep(a.after)
    after = rss_kib(a.pid)
    mib = lambda k: k / 1024
    print(
        f"port {a.port}: RSS {mib(before):.1f} MiB before, {mib(idle):.1f} MiB with {a.conns} idle "
        f"connections ({(idle - before) * 1024 / a.conns:.0f} B each, {a.hold:g} s idle), {mib(after):.1f} MiB {a.after:g} s "
        f"after they closed"
    )


if __name__ == "__main__":
    os.nice(0)
    asyncio.run(main())
