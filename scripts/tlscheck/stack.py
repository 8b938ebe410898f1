"""The stack scripts/tls-check.py runs (a test CA, shedgate over TLS, a counting upstream) and its helpers."""
import base64
import collections
import datetime
import http.client
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "tls-check.py")
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
        up = subprocess.Popen([sys.executable, SCRIPT, "upstream"], stdout=subprocess.PIPE, text=True)
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


class Ids:
    def __init__(self):
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, prefix):
        with self.lock:
            self.n += 1
            return f"{prefix}-{os.getpid()}-{self.n}"
