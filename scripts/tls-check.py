#!/usr/bin/env python3
"""shedgate over TLS, end to end with real tools: testssl.sh, real clients, a minute of rotation.

Run by scripts/tls-check.sh (which installs what it needs and this script's venv); by hand:
    target/tls-check/bin/python scripts/tls-check.py target/debug/shedgate
Needs on PATH: openssl, curl, testssl (Debian's testssl.sh), h2load (nghttp2-client); in the
interpreter: requests, cloudevents, standardwebhooks.

1. A test CA and a leaf for localhost and 127.0.0.1 (ECDSA P-256, 90 days), made with openssl
   and laid out as a Kubernetes Secret volume (tls.crt and tls.key through a `..data`
   symlink); shedgate serves it, in front of a real upstream on loopback (this script's
   `upstream` mode: counts every request it receives by its X-Check-Id), with the policy
   policies/examples/cases (its routes for CloudEvents and Standard Webhooks).
2. testssl (protocols, cipher categories, ciphers per protocol, forward secrecy, server
   preference and defaults, vulnerabilities; 30-50 s) with --add-ca the test CA: fails on
   a finding of severity HIGH or CRITICAL other than certificate trust or revocation, on
   TLS 1.0/1.1 or SSL offered, or on an accepted cipher that is not AEAD with forward
   secrecy. openssl s_client then tries TLS 1.0, 1.1 and CBC/RSA-key-exchange suites: the
   server must answer each with an alert.
3. Real clients over TLS, decided and shed as over plain HTTP: curl (HTTP/1.1 and --http2,
   which must negotiate h2), Python requests, h2load (must use h2), CloudEvents (binary and
   structured, the `cloudevents` library) and Standard Webhooks (signed by the
   `standardwebhooks` library, verified at the upstream). Pressure pinned at 0: a sheddable
   event is admitted; pinned at 0.75: the same is answered 503 + Retry-After and the upstream
   never sees it, while a `never` stream's event is delivered.
4. Rotation: a fresh leaf from the same CA swapped in every second for a minute (ROTATE_S)
   under a steady load of `never` requests (connections renewed every 10 requests, so new
   handshakes run throughout); every 2xx the client saw must have reached the upstream (by
   id). A mismatched pair and a garbage certificate are swapped in mid-run: the serving
   certificate stays (handshakes show its serial), shedgate_tls_reloads_total{outcome=
   "refused"} grows, requests keep succeeding. New handshakes must see new serials.

PHASES (default testssl,s_client,clients,rotation) runs a subset; ROTATE_S (60) and
LOAD_WORKERS (4) size the rotation.

Loopback only, kernel-chosen ports; every process it starts is stopped on exit. Exit 0 when
every check passed, 1 otherwise; a summary lists each check.
"""
import os
import shutil
import signal
import sys
import tempfile
import time

from tlscheck.probes import clients, s_client_refusals, testssl
from tlscheck.rotation import rotation
from tlscheck.stack import PHASES, POLICIES, ROOT, Checks, Pki, Stack, upstream_main


# ---------------------------------------------------------------------------- main

def main():
    binary = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="tls-check-")
    checks = Checks()
    stack = None
    began = time.time()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    phases = {}
    try:
        pki = Pki(work)
        first = pki.rotate()
        stack = Stack(binary, pki, work)
        print(f"== shedgate over TLS on 127.0.0.1:{stack.port} (leaf {first}), admin {stack.admin}, "
              f"upstream {stack.upstream_port}, policy {os.path.relpath(POLICIES, ROOT)}", flush=True)
        for name, phase in (("testssl", testssl), ("s_client", s_client_refusals), ("clients", clients),
                            ("rotation", rotation)):
            if name not in PHASES:
                continue
            print(f"== {name}", flush=True)
            t0 = time.time()
            try:
                phase(stack, checks)
            except Exception as e:  # noqa: BLE001 - a phase that breaks is a failed check, and the next runs
                checks.check(f"{name} ran to the end", False, f"{type(e).__name__}: {e}")
            phases[name] = time.time() - t0
        checks.check("shedgate is still running", stack.sg.poll() is None, f"exit {stack.sg.poll()}")
    finally:
        if stack:
            stack.stop()
            panics = [l for l in open(stack.log) if "panicked" in l]
            checks.check("no panic in shedgate's log", not panics, "".join(panics[:3]))
        shutil.rmtree(work, ignore_errors=True)
    failed = checks.failed()
    print(f"\n== summary: {len(checks.rows) - len(failed)} of {len(checks.rows)} checks passed in "
          f"{time.time() - began:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in phases.items())})")
    for name, _, detail in failed:
        print(f"FAIL {name}: {detail}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if sys.argv[1:] == ["upstream"]:
        upstream_main()
    elif len(sys.argv) == 2:
        main()
    else:
        sys.exit("usage: tls-check.py path/to/shedgate")
