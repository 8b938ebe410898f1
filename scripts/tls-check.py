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
import base64
import collections
import datetime
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
POLICIES = os.path.join(ROOT, "policies", "examples", "cases")
ROTATE_S = int(os.environ.get("ROTATE_S", "60"))
PHASES = os.environ.get("PHASES", "testssl,s_client,clients,rotation").split(",")
LOAD_WORKERS = int(os.environ.get("LOAD_WORKERS", "4"))
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"shedgate-test-secret").decode()
# Senders' events (policies/examples/cases): Munich and Nairobi and Tokyo have the default
# rank 50, shed whole at pressure 0.75; the `never` streams are forwarded at any pressure.
SHEDDABLE_STREAM, NEVER_STREAM = "vehicle.position", "geofence.transition"
SHED_PIN = 0.75


# ---------------------------------------------------------------------------- the upstream

def upstream_main():
    """A real HTTP/1.1 upstream on loopback: answers 200 to every request, counts each by its
    X-Check-Id, records whether X-Forwarded-Proto said https and whether a Standard Webhooks
    signature verified. GET /__received (sent to it directly) returns the counts as JSON."""
    from standardwebhooks.webhooks import Webhook

    hook = Webhook(WEBHOOK_SECRET)
    lock = threading.Lock()
    ids = collections.Counter()
    proto = {}
    verified = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def body(self):
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    chunk = self.rfile.read(size + 2)[:size]
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return out
                    out += chunk
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def answer(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.body()
            if self.path == "/__received":
                with lock:
                    self.answer(200, {"ids": dict(ids), "proto": dict(proto), "verified": dict(verified)})
            else:
                self.answer(200, {"ok": True})

        def do_POST(self):
            body = self.body()
            rid = self.headers.get("X-Check-Id")
            if rid:
                ok = None
                if self.headers.get("webhook-signature"):
                    try:
                        hook.verify(body, dict(self.headers.items()))
                        ok = True
                    except Exception:  # noqa: BLE001 - any failure is "did not verify"
                        ok = False
                with lock:
                    ids[rid] += 1
                    proto[rid] = self.headers.get("X-Forwarded-Proto", "")
                    if ok is not None:
                        verified[rid] = ok
            self.answer(200, {"ok": True})

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


# ---------------------------------------------------------------------------- helpers

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Checks:
    """Each check's name, verdict and detail, printed as it happens and summed up at the end."""

    def __init__(self):
        self.rows = []

    def check(self, name, ok, detail=""):
        self.rows.append((name, bool(ok), detail))
        print(f"  {'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    def failed(self):
        return [r for r in self.rows if not r[1]]


class Pki:
    """A test CA, and leaves it signs for localhost and 127.0.0.1 (ECDSA P-256, 90 days),
    written as a Kubernetes Secret volume: DIR/tls.crt -> ..data/tls.crt, ..data -> a
    timestamped directory, swapped by renaming a new ..data symlink over the old one."""

    def __init__(self, work):
        self.work = work
        self.dir = os.path.join(work, "tls")
        os.makedirs(self.dir)
        self.ca_key, self.ca = os.path.join(work, "ca.key"), os.path.join(work, "ca.pem")
        self.ext = os.path.join(work, "leaf.ext")
        with open(self.ext, "w") as f:
            f.write("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                    "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
                    "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
        self.openssl(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                      "-keyout", self.ca_key, "-out", self.ca, "-days", "365", "-subj", "/CN=shedgate tls-check CA",
                      "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        self.generation = 0
        self.cert = os.path.join(self.dir, "tls.crt")
        self.key = os.path.join(self.dir, "tls.key")

    def openssl(self, args):
        r = run(["openssl", *args])
        if r.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {r.stderr.strip()}")
        return r.stdout

    def leaf(self, out_dir):
        """Writes a fresh key and leaf into out_dir (tls.key, tls.crt); returns its serial (hex)."""
        key, csr, crt = (os.path.join(out_dir, n) for n in ("tls.key", "leaf.csr", "tls.crt"))
        self.openssl(["req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                      "-keyout", key, "-out", csr, "-subj", "/CN=localhost"])
        serial = os.urandom(8).hex().upper().lstrip("0") or "1"
        self.openssl(["x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-set_serial", "0x" + serial,
                      "-days", "90", "-extfile", self.ext, "-out", crt])
        os.remove(csr)
        return serial

    def swap(self, fill):
        """One Kubernetes-style update: a new timestamped directory filled by fill(dir), then
        ..data renamed over to point at it, the old directory removed; the first call also
        makes the tls.crt and tls.key links. Returns fill's result."""
        self.generation += 1
        name = f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{self.generation}"
        new = os.path.join(self.dir, name)
        os.makedirs(new)
        result = fill(new)
        data = os.path.join(self.dir, "..data")
        old = os.readlink(data) if os.path.islink(data) else None
        tmp = os.path.join(self.dir, "..data_tmp")
        os.symlink(name, tmp)
        os.rename(tmp, data)
        for link in ("tls.crt", "tls.key"):
            path = os.path.join(self.dir, link)
            if not os.path.islink(path):
                os.symlink(os.path.join("..data", link), path)
        if old:
            shutil.rmtree(os.path.join(self.dir, old), ignore_errors=True)
        return result

    def rotate(self):
        return self.swap(self.leaf)

    def mismatched(self):
        """A pair whose key is not the leaf's: a fresh leaf with another fresh leaf's key."""
        def fill(d):
            other = tempfile.mkdtemp(dir=self.work)
            self.leaf(d)
            self.leaf(other)
            shutil.copy(os.path.join(other, "tls.key"), os.path.join(d, "tls.key"))
            shutil.rmtree(other)
        self.swap(fill)

    def garbage(self):
        """A certificate file that is no PEM at all, beside a good key."""
        def fill(d):
            self.leaf(d)
            with open(os.path.join(d, "tls.crt"), "w") as f:
                f.write("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
        self.swap(fill)


class Stack:
    """The upstream and shedgate, started and stopped together."""

    def __init__(self, binary, pki, work):
        self.procs = []
        self.work = work
        self.pki = pki
        up = subprocess.Popen([sys.executable, os.path.abspath(__file__), "upstream"], stdout=subprocess.PIPE, text=True)
        self.procs.append(up)
        self.upstream_port = int(up.stdout.readline())
        self.port, self.admin = free_port(), free_port()
        self.log = os.path.join(work, "shedgate.log")
        self.sg = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--admin-listen", f"127.0.0.1:{self.admin}",
             "--upstream", f"http://127.0.0.1:{self.upstream_port}", "--policies", POLICIES,
             "--tls-cert", pki.cert, "--tls-key", pki.key, "--shutdown-delay", "0s", "--drain-timeout", "2s"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.procs.append(self.sg)
        deadline = time.time() + 60
        while True:
            try:
                self.admin_get("/healthz")
                break
            except OSError:
                if self.sg.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"shedgate did not start; its log:\n{open(self.log).read()[-3000:]}")
                time.sleep(0.2)

    def stop(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def admin_get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}{path}", timeout=5) as r:
            return r.read().decode()

    def pin(self, value):
        body = json.dumps({"pin": value}).encode() if value is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.admin}/pressure", data=body,
                                     method="PUT" if value is not None else "DELETE",
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=5).read()

    def metric(self, name, labels=""):
        """The value of one series of shedgate's /metrics (0 when absent)."""
        pattern = re.compile(r"^" + re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)$", re.M)
        m = pattern.search(self.admin_get("/metrics"))
        return float(m.group(1)) if m else 0.0

    def received(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.upstream_port}/__received", timeout=10) as r:
            return json.loads(r.read())

    def url(self, path="/ingest"):
        return f"https://localhost:{self.port}{path}"


# ---------------------------------------------------------------------------- 2. testssl

# Findings about the test CA's standing, not the server: no revocation source, no trust path.
TRUST_AND_REVOCATION = {"cert_chain_of_trust", "cert_trust", "cert_revocation", "cert_crlDistributionPoints",
                        "cert_ocspURL", "OCSP_stapling", "cert_mustStapleExtension"}
# Accepted suites: AEAD (GCM, ChaCha20-Poly1305, CCM) with forward secrecy (TLS 1.3, or ECDHE).
GOOD_SUITE = re.compile(r"^TLS_(AES_(128|256)_GCM|CHACHA20_POLY1305|AES_128_CCM)|^ECDHE-(ECDSA|RSA)-(AES(128|256)-GCM|CHACHA20-POLY1305)")


def testssl(stack, checks):
    out = os.path.join(stack.work, "testssl.json")
    t0 = time.time()
    r = run(["testssl", "--quiet", "--color", "0", "--warnings", "off", "--add-ca", stack.pki.ca,
             "--ip", "127.0.0.1", "--nodns", "none", "--jsonfile", out,
             "-p", "-s", "-E", "-f", "-P", "-S", "-U", f"localhost:{stack.port}"])
    took = time.time() - t0
    if not os.path.exists(out):
        checks.check("testssl ran", False, f"exit {r.returncode}, no JSON; output:\n{(r.stdout + r.stderr)[-2000:]}")
        return
    findings = json.load(open(out))
    checks.check("testssl ran", len(findings) > 20, f"{len(findings)} findings in {took:.0f} s")
    by_id = {f["id"]: f for f in findings}
    bad = [f for f in findings if f["severity"] in ("HIGH", "CRITICAL", "FATAL")
           and f["id"].split(" ")[0] not in TRUST_AND_REVOCATION]
    checks.check("testssl: no HIGH or CRITICAL finding besides certificate trust or revocation", not bad,
                 "; ".join(f"{f['severity']} {f['id']}: {f['finding']}" for f in bad))
    chain = by_id.get("cert_chain_of_trust", {}).get("finding", "")
    checks.check("testssl: the chain verifies against the test CA (--add-ca)", chain.startswith("passed"), chain)
    for proto in ("SSLv2", "SSLv3", "TLS1", "TLS1_1"):
        finding = by_id.get(proto, {}).get("finding", "missing")
        checks.check(f"testssl: {proto} refused", finding.startswith("not offered"), finding)
    for proto in ("TLS1_2", "TLS1_3"):
        finding = by_id.get(proto, {}).get("finding", "missing")
        checks.check(f"testssl: {proto} offered", finding.startswith("offered"), finding)
    for cat in ("cipherlist_NULL", "cipherlist_aNULL", "cipherlist_EXPORT", "cipherlist_LOW",
                "cipherlist_3DES_IDEA", "cipherlist_AVERAGE"):
        finding = by_id.get(cat, {}).get("finding", "missing")
        checks.check(f"testssl: {cat} refused", finding.startswith("not offered"), finding)
    suites = [f["finding"].split()[3] for f in findings if f["id"].startswith("cipher-tls")]
    weak = [s for s in suites if not GOOD_SUITE.match(s)]
    checks.check("testssl: every accepted suite is AEAD with forward secrecy", suites and not weak,
                 f"accepted {', '.join(suites)}" + (f"; weak: {', '.join(weak)}" if weak else ""))
    for vuln in ("heartbleed", "CCS", "ROBOT", "secure_client_renego", "CRIME_TLS", "POODLE_SSL",
                 "SWEET32", "FREAK", "DROWN", "LOGJAM", "BEAST", "LUCKY13", "RC4"):
        if vuln not in by_id:
            checks.check(f"testssl: {vuln} tested", False, "no finding: the vulnerability scan did not run it")


def s_client_refusals(stack, checks):
    """openssl s_client must be answered with an alert, never a session, for TLS 1.0, 1.1 and
    for TLS 1.2 suites without AEAD or forward secrecy (SECLEVEL=0 so the client offers them)."""
    failed_before = stack.metric("shedgate_tls_handshakes_total", 'outcome="failed"')
    attempts = [
        ("TLS 1.0", ["-tls1", "-cipher", "DEFAULT:@SECLEVEL=0"]),
        ("TLS 1.1", ["-tls1_1", "-cipher", "DEFAULT:@SECLEVEL=0"]),
        ("TLS 1.2 CBC suites (ECDHE-ECDSA-AES128-SHA, -AES256-SHA384)",
         ["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA384:ECDHE-ECDSA-AES128-SHA256:@SECLEVEL=0"]),
        ("TLS 1.2 RSA key exchange and 3DES (AES128-GCM-SHA256, DES-CBC3-SHA)",
         ["-tls1_2", "-cipher", "AES128-GCM-SHA256:AES256-SHA:DES-CBC3-SHA:@SECLEVEL=0"]),
    ]
    for name, args in attempts:
        r = run(["openssl", "s_client", "-connect", f"127.0.0.1:{stack.port}", "-servername", "localhost", *args],
                input="", timeout=20)
        text = r.stdout + r.stderr
        alert = re.search(r"alert number (\d+)", text)
        no_session = "Cipher is (NONE)" in text or r.returncode != 0
        checks.check(f"openssl s_client: {name} refused by the server", alert and no_session,
                     f"server alert {alert.group(1)}" if alert else "no alert from the server: " + text.strip()[-300:])
    r = run(["openssl", "s_client", "-connect", f"127.0.0.1:{stack.port}", "-servername", "localhost", "-tls1_2",
             "-CAfile", stack.pki.ca, "-verify_return_error"], input="", timeout=20)
    m = re.search(r"Cipher is (\S+)", r.stdout)
    checks.check("openssl s_client: TLS 1.2 with the test CA accepted", m and m.group(1) != "(NONE)" and r.returncode == 0,
                 m.group(1) if m else r.stderr.strip()[-300:])
    failed_after = stack.metric("shedgate_tls_handshakes_total", 'outcome="failed"')
    checks.check("shedgate_tls_handshakes_total{outcome=\"failed\"} counts the refusals",
                 failed_after - failed_before >= len(attempts), f"+{failed_after - failed_before:.0f}")


# ---------------------------------------------------------------------------- 3. clients

class Ids:
    def __init__(self):
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, prefix):
        with self.lock:
            self.n += 1
            return f"{prefix}-{os.getpid()}-{self.n}"


def position_body():
    return json.dumps({"device_id": "veh-0042", "lat": 48.1372, "lon": 11.5756, "occurred_at": now_rfc3339()})


def curl(stack, rid, stream, http2):
    """One POST by curl; returns (status, headers, http_version)."""
    hdr = os.path.join(stack.work, "curl-headers")
    r = run(["curl", "-sS", "--cacert", stack.pki.ca, "--http2" if http2 else "--http1.1", "-o", os.devnull,
             "-D", hdr, "-w", "%{http_code} %{http_version}", "-H", "Content-Type: application/json",
             "-H", f"X-Stream: {stream}", "-H", f"X-Check-Id: {rid}", "--data-binary", position_body(),
             "--max-time", "20", stack.url()])
    if r.returncode != 0:
        return 0, {}, f"curl failed: {r.stderr.strip()}"
    status, version = r.stdout.split()
    headers = {}
    for line in open(hdr).read().splitlines()[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(status), headers, version


def h2load(stack, rid, stream, n=20):
    """n POSTs by h2load over 2 connections, 4 streams each at a time; returns
    (application protocol, count of 2xx, count of 5xx, output)."""
    body = os.path.join(stack.work, "h2load-body.json")
    with open(body, "w") as f:
        f.write(position_body())
    r = run(["h2load", "-n", str(n), "-c", "2", "-m", "4", "-d", body, "-H", "content-type: application/json",
             "-H", f"x-stream: {stream}", "-H", f"x-check-id: {rid}", stack.url()], timeout=60)
    proto = re.search(r"Application protocol: (\S+)", r.stdout)
    codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", r.stdout)
    if not codes:
        return (proto.group(1) if proto else "none"), 0, 0, r.stdout + r.stderr
    return (proto.group(1) if proto else "none"), int(codes.group(1)), int(codes.group(4)), r.stdout


def clients(stack, checks):
    import requests
    from cloudevents.core.bindings.http import to_binary_event, to_structured_event
    from cloudevents.core.v1.event import CloudEvent
    from standardwebhooks.webhooks import Webhook

    ids = Ids()
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE or a proxy from the environment would win
    session.verify = stack.pki.ca
    # expected[id] = (what, delivered count expected); each 503 also checked for Retry-After.
    expected = {}

    def expect(what, rid, status, headers, admitted, count=1):
        if admitted:
            ok = 200 <= status < 300
            checks.check(f"{what}: admitted, 2xx", ok, f"status {status}")
            expected[rid] = (what, count)
        else:
            ra = headers.get("retry-after", "")
            checks.check(f"{what}: shed, 503 + Retry-After", status == 503 and ra.isdigit(),
                         f"status {status}, Retry-After {ra or 'absent'}")
            expected[rid] = (what, 0)

    def by_requests(what, rid, stream, admitted):
        r = session.post(stack.url(), data=position_body(), timeout=20,
                         headers={"Content-Type": "application/json", "X-Stream": stream, "X-Check-Id": rid})
        expect(what, rid, r.status_code, {k.lower(): v for k, v in r.headers.items()}, admitted)

    def by_curl(what, rid, stream, admitted, http2=False):
        status, headers, version = curl(stack, rid, stream, http2)
        if http2:
            checks.check(f"{what}: negotiated h2", version == "2",
                         f"curl --http2 got HTTP/{version}: the proxy offered no h2 in ALPN")
        expect(what, rid, status, headers, admitted)

    def by_h2load(what, rid, stream, admitted, n=20):
        proto, ok2xx, shed5xx, out = h2load(stack, rid, stream, n)
        checks.check(f"{what}: negotiated h2", proto == "h2",
                     f"h2load's application protocol is {proto}: the proxy offered no h2 in ALPN")
        if admitted:
            checks.check(f"{what}: {n} streams admitted, 2xx", ok2xx == n, f"{ok2xx} 2xx, {shed5xx} 5xx")
        else:
            checks.check(f"{what}: {n} streams shed, 503", shed5xx == n, f"{ok2xx} 2xx, {shed5xx} 5xx")
        expected[rid] = (what, n if admitted else 0)

    def ce_position(mode):
        event = CloudEvent(attributes={"type": "com.example.fleet.position", "source": "/fleet/vehicles/311",
                                       "subject": "vehicle-311", "datacontenttype": "application/json",
                                       "time": datetime.datetime.now(datetime.timezone.utc)},
                           data={"lat": -1.28638, "lon": 36.81723, "speed_mps": 7.4})
        return (to_binary_event if mode == "binary" else to_structured_event)(event)

    def ce_geofence(mode):
        event = CloudEvent(attributes={"type": "com.example.geofence.updated", "source": "/admin/geofences",
                                       "datacontenttype": "application/json",
                                       "time": datetime.datetime.now(datetime.timezone.utc)},
                           data={"geofence_id": "gf-12", "centroid": {"lat": -1.2921, "lon": 36.8219}})
        return (to_binary_event if mode == "binary" else to_structured_event)(event)

    def by_cloudevents(what, rid, message, admitted):
        r = session.post(stack.url("/ingest/ce"), data=message.body, timeout=20,
                         headers={**message.headers, "X-Check-Id": rid})
        expect(what, rid, r.status_code, {k.lower(): v for k, v in r.headers.items()}, admitted)

    hook = Webhook(WEBHOOK_SECRET)

    def by_webhook(what, rid, event_type, admitted):
        sent = datetime.datetime.now(datetime.timezone.utc)
        payload = json.dumps({"type": event_type, "timestamp": now_rfc3339(),
                              "data": {"vehicle": "311", "lat": 35.68949, "lon": 139.69171}})
        msg_id = "msg_" + rid
        headers = {"Content-Type": "application/json", "webhook-id": msg_id,
                   "webhook-timestamp": str(int(sent.timestamp())),
                   "webhook-signature": hook.sign(msg_id, sent, payload), "X-Check-Id": rid}
        r = session.post(stack.url("/ingest/hooks"), data=payload, headers=headers, timeout=20)
        expect(what, rid, r.status_code, {k.lower(): v for k, v in r.headers.items()}, admitted)
        webhooks.append(rid)

    webhooks = []
    sheddable_cases = [
        ("curl HTTP/1.1", lambda w, rid, a: by_curl(w, rid, SHEDDABLE_STREAM, a)),
        ("curl --http2", lambda w, rid, a: by_curl(w, rid, SHEDDABLE_STREAM, a, http2=True)),
        ("requests", lambda w, rid, a: by_requests(w, rid, SHEDDABLE_STREAM, a)),
        ("h2load", lambda w, rid, a: by_h2load(w, rid, SHEDDABLE_STREAM, a)),
        ("CloudEvents binary", lambda w, rid, a: by_cloudevents(w, rid, ce_position("binary"), a)),
        ("CloudEvents structured", lambda w, rid, a: by_cloudevents(w, rid, ce_position("structured"), a)),
        ("Standard Webhooks", lambda w, rid, a: by_webhook(w, rid, "vehicle.position", a)),
    ]
    never_cases = [
        ("curl HTTP/1.1", lambda w, rid: by_curl(w, rid, NEVER_STREAM, True)),
        ("curl --http2", lambda w, rid: by_curl(w, rid, NEVER_STREAM, True, http2=True)),
        ("requests", lambda w, rid: by_requests(w, rid, NEVER_STREAM, True)),
        ("h2load", lambda w, rid: by_h2load(w, rid, NEVER_STREAM, True)),
        ("CloudEvents binary", lambda w, rid: by_cloudevents(w, rid, ce_geofence("binary"), True)),
        ("CloudEvents structured", lambda w, rid: by_cloudevents(w, rid, ce_geofence("structured"), True)),
        ("Standard Webhooks", lambda w, rid: by_webhook(w, rid, "geofence.transition", True)),
    ]
    stack.pin(0.0)
    print("  -- pressure pinned at 0: sheddable events admitted", flush=True)
    for name, send in sheddable_cases:
        send(f"{name}, sheddable at pressure 0", ids("c"), True)
    stack.pin(SHED_PIN)
    print(f"  -- pressure pinned at {SHED_PIN}: sheddable events shed, never streams delivered", flush=True)
    for name, send in sheddable_cases:
        send(f"{name}, sheddable at pressure {SHED_PIN}", ids("c"), False)
    for name, send in never_cases:
        send(f"{name}, never stream at pressure {SHED_PIN}", ids("c"))
    stack.pin(None)
    got = stack.received()
    for rid, (what, count) in expected.items():
        seen = got["ids"].get(rid, 0)
        checks.check(f"{what}: the upstream received {count}", seen == count, f"received {seen}")
        if seen:
            proto = got["proto"].get(rid)
            if proto != "https":
                checks.check(f"{what}: X-Forwarded-Proto https at the upstream", False, f"got {proto!r}")
    for rid in webhooks:
        if got["ids"].get(rid):
            checks.check(f"Standard Webhooks {rid}: the signature verifies at the upstream",
                         got["verified"].get(rid) is True, f"verified: {got['verified'].get(rid)}")


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
    checks.check("rotation: acknowledged => delivered (every 2xx reached the upstream, by id)",
                 acknowledged and not lost, f"{len(acknowledged)} acknowledged, {len(lost)} not delivered "
                 f"{lost[:5]}, {len(duplicated)} delivered twice")
    checks.check("rotation: no request failed and no non-2xx answer", not failures and not refused_answers,
                 f"{len(failures)} failures {failures[:3]}, non-2xx {dict(refused_answers)}")
    checks.check("rotation: new handshakes saw new certificates (serials changed)", len(seen & set(written)) >= 2,
                 f"{len(seen & set(written))} of {len(written)} written serials seen by new handshakes")
    checks.check("rotation: the last leaf written is the one serving", serving() == written[-1],
                 f"serving {serving()}, last written {written[-1]}")
    checks.check("rotation: shedgate_tls_reloads_total{outcome=\"swapped\"} counts rotations",
                 swapped >= len(written) // 2, f"{swapped:.0f} swaps for {len(written)} pairs written")


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
