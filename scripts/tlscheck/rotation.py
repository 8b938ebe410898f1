"""The minute of certificate rotation under load of scripts/tls-check.py."""
import collections
import http.client
import http.server
import json
import socket
import ssl
import threading
import time

from tlscheck.stack import LOAD_WORKERS, NEVER_STREAM, ROTATE_S, Ids

# ---------------------------------------------------------------------------- 4. rotation

def rotation(stack, checks):
    ctx = ssl.create_default_context(cafile=stack.pki.ca)
    stop = threading.Event()
    lock = threading.Lock()
    acknowledged, refused_answers, failures = [], collections.Counter(), []
    serials = []  # (time, serial) from fresh handshakes
    ids = Ids()

    def load(worker):
        conn, used = None, 0
        body = json.dumps({"geofence_id": "gf-12", "lat": 52.52, "lon": 13.405})
        while not stop.is_set():
            if conn is None or used >= 10:
                if conn:
                    conn.close()
                conn, used = http.client.HTTPSConnection("localhost", stack.port, context=ctx, timeout=15), 0
            rid = ids(f"r{worker}")
            try:
                conn.request("POST", "/ingest", body=body, headers={
                    "Content-Type": "application/json", "X-Stream": NEVER_STREAM, "X-Check-Id": rid})
                resp = conn.getresponse()
                resp.read()
                used += 1
                with lock:
                    if 200 <= resp.status < 300:
                        acknowledged.append(rid)
                    else:
                        refused_answers[resp.status] += 1
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                with lock:
                    failures.append(f"{rid}: {type(e).__name__}: {e}")
                conn.close()
                conn = None

    def observe():
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as s:
                    with ctx.wrap_socket(s, server_hostname="localhost") as t:
                        serial = t.getpeercert()["serialNumber"].upper().lstrip("0")
                with lock:
                    serials.append((time.time(), serial))
            except (OSError, ssl.SSLError) as e:
                with lock:
                    failures.append(f"observer handshake: {type(e).__name__}: {e}")
            stop.wait(0.25)

    def serving():
        with lock:
            return serials[-1][1] if serials else None

    def wait_serving(serial, within):
        deadline = time.time() + within
        while time.time() < deadline:
            if serving() == serial:
                return True
            time.sleep(0.05)
        return serving() == serial

    swapped0 = stack.metric("shedgate_tls_reloads_total", 'outcome="swapped"')
    refused0 = stack.metric("shedgate_tls_reloads_total", 'outcome="refused"')
    threads = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(LOAD_WORKERS)]
    threads.append(threading.Thread(target=observe, daemon=True))
    for t in threads:
        t.start()
    start = time.time()
    written = []  # serials of the good pairs written
    broken_at = {ROTATE_S // 3: ("a mismatched pair", stack.pki.mismatched),
                 2 * ROTATE_S // 3: ("a garbage certificate", stack.pki.garbage)}
    tick = 0
    try:
        while tick < ROTATE_S:
            if tick in broken_at:
                what, write = broken_at[tick]
                last_good = written[-1]
                settled = wait_serving(last_good, 5)
                checks.check(f"rotation: the last good leaf ({last_good}) serves before {what}", settled,
                             f"handshakes show {serving()}")
                refused_before = stack.metric("shedgate_tls_reloads_total", 'outcome="refused"')
                with lock:
                    acked_before = len(acknowledged)
                write()
                time.sleep(3)  # the debounce is 250 ms; a reload is two small files
                refused_after = stack.metric("shedgate_tls_reloads_total", 'outcome="refused"')
                with lock:
                    recent = [s for t, s in serials if t > time.time() - 2]
                    acked_during = len(acknowledged) - acked_before
                checks.check(f"rotation: {what} is refused and counted", refused_after > refused_before,
                             f"shedgate_tls_reloads_total{{outcome=\"refused\"}} {refused_before:.0f} -> {refused_after:.0f}")
                checks.check(f"rotation: after {what}, new handshakes still get the serving leaf",
                             recent and all(s == last_good for s in recent),
                             f"serials seen in the last 2 s: {sorted(set(recent))}")
                checks.check(f"rotation: requests keep succeeding after {what}", acked_during > 0,
                             f"{acked_during} acknowledged in those 3 s")
                tick += 3
                continue
            written.append(stack.pki.rotate())
            tick += 1
            delay = start + tick - time.time()
            if delay > 0:
                time.sleep(delay)
        wait_serving(written[-1], 5)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    took = time.time() - start
    swapped = stack.metric("shedgate_tls_reloads_total", 'outcome="swapped"') - swapped0
    refused = stack.metric("shedgate_tls_reloads_total", 'outcome="refused"') - refused0
    got = stack.received()["ids"]
    lost = [rid for rid in acknowledged if got.get(rid, 0) < 1]
    duplicated = [rid for rid in acknowledged if got.get(rid, 0) > 1]
    seen = {s for _, s in serials}
    print(f"  rotation: {len(written)} good pairs written in {took:.0f} s; reloads swapped {swapped:.0f}, "
          f"refused {refused:.0f}; {len(acknowledged)} requests acknowledged, {len(failures)} failed, "
          f"{sum(refused_answers.values())} non-2xx; {len(serials)} observer handshakes saw {len(seen)} serials", flush=True)
    checks.check("rotation: acknowledged => delivered once (every 2xx reached the upstream once, by id)",
                 acknowledged and not lost and not duplicated, f"{len(acknowledged)} acknowledged, {len(lost)} not delivered "
                 f"{lost[:5]}, {len(duplicated)} delivered twice")
    checks.check("rotation: no request failed and no non-2xx answer", not failures and not refused_answers,
                 f"{len(failures)} failures {failures[:3]}, non-2xx {dict(refused_answers)}")
    checks.check("rotation: new handshakes saw new certificates (serials changed)", len(seen & set(written)) >= 2,
                 f"{len(seen & set(written))} of {len(written)} written serials seen by new handshakes")
    checks.check("rotation: the last leaf written is the one serving", serving() == written[-1],
                 f"serving {serving()}, last written {written[-1]}")
    checks.check("rotation: shedgate_tls_reloads_total{outcome=\"swapped\"} counts rotations",
                 swapped >= len(written) // 2, f"{swapped:.0f} swaps for {len(written)} pairs written")
