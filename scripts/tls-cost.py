#!/usr/bin/env python3
"""The CPU cost of TLS: shedgate beside nginx with the same certificate, in one run.

Exact command (project root, a quiet machine, the release binary; about 6 minutes):
    cargo build --release && scripts/tls-cost.py target/release/shedgate

Two figures per server, CPU microseconds on the server's core:
- per request of the sheddable yes over TLS, keep-alive: wrk (2 threads, 64 connections, the
  shared harness's 312-byte vehicle.position POST, Berlin, rank 5: decided and forwarded) on
  core 0, the server alone on core 1;
- per new connection: the same POST with `Connection: close`, so every request is a TCP
  connect, a full TLS handshake (wrk resumes no session), one request and the close. The
  handshake's own share is that minus the keep-alive request, per round.
shedgate over plain HTTP runs beside them as the reference for what TLS adds. The method is
../shared/bench/costofno.py's: CPU from /proc/PID/stat over a measured run that follows a
warm-up run of the same length, rounds interleaved (the order reversed every other round,
since the 2-core VM drifts between runs), medians of the rounds with their quartiles.

Both servers as shipped: TLS 1.2 and 1.3, their default suites and session tickets; the
client (wrk's OpenSSL) picks TLS 1.3, TLS_AES_256_GCM_SHA384 and X25519 with either (printed).
The certificate is a leaf from a throwaway CA, ECDSA P-256 by default (KEY=rsa: RSA 2048,
cert-manager's default). The upstream is nginx `return 204` on core 0. nginx: one worker,
`proxy_pass` to the upstream with a keep-alive pool, as ../shared/bench/conf.

Usage: scripts/tls-cost.py SHEDGATE [POLICIES]
(POLICIES default: scripts/bench-policies.sh's copy of policies/, so that the harness body's
fixed time is not stale; DUR seconds per run, default 6; ROUNDS, default 5; KEY ec|rsa.)
Needs wrk, nginx (nginx-light), openssl and taskset; loopback ports chosen by the kernel.
Prints each measurement, then the medians with their quartiles, a Markdown table of the
medians and a JSON line.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
EXE = os.path.abspath(sys.argv[1])
DUR = int(os.environ.get("DUR", "6"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
KEY = os.environ.get("KEY", "ec")
run = tempfile.mkdtemp(prefix="tls-cost-")

# The shared harness's body (../shared/bench/post.lua), with its RESULT line.
LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Stream"] = "vehicle.position"
%s
wrk.body = '{"device_id":"veh-0042","fleet_id":"fleet-berlin-07","lat":52.520008,"lon":13.404954,' ..
           '"occurred_at":"2026-11-29T12:00:00Z","speed_kmh":41.5,"heading_deg":187.0,' ..
           '"odometer_km":128734.2,"battery_pct":76,"ignition":true,"driver_id":"drv-1187",' ..
           '"trip_id":"trip-20261129-0042-03","seq":981234,"source":"telematics-gw-3"}'
function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format("RESULT requests=%%d duration_s=%%.3f rps=%%.1f err_connect=%%d err_read=%%d err_write=%%d err_status=%%d err_timeout=%%d\\n",
      summary.requests, summary.duration / 1e6, summary.requests / (summary.duration / 1e6),
      e.connect, e.read, e.write, e.status, e.timeout))
end
"""
USER = "user root; " if os.geteuid() == 0 else ""
NGINX = USER + """worker_processes 1; daemon off; pid %(d)s/nginx.pid; error_log %(d)s/error.log crit;
worker_rlimit_nofile 8192; events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000; keepalive_timeout 65s;
  client_body_temp_path %(d)s/b; proxy_temp_path %(d)s/p; fastcgi_temp_path %(d)s/f; uwsgi_temp_path %(d)s/u; scgi_temp_path %(d)s/s;
%(servers)s
}
"""
UPSTREAM = "  server { listen 127.0.0.1:%(port)d backlog=4096; location / { return 204; } }"
FRONT = """  upstream fast { server 127.0.0.1:%(up)d; keepalive 128; keepalive_requests 10000000; }
  server { listen 127.0.0.1:%(port)d ssl backlog=4096;
    ssl_certificate %(cert)s; ssl_certificate_key %(key)s; ssl_protocols TLSv1.2 TLSv1.3;
    location / { proxy_pass http://fast; proxy_http_version 1.1; proxy_set_header Connection ""; } }"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def sh(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} failed: {r.stderr.strip()}")
    return r.stdout


def pki():
    """A throwaway CA and a leaf for localhost and 127.0.0.1 signed by it (the chain file holds
    the leaf, then nothing: the CA is the root)."""
    ca_key, ca, key, csr, cert = (os.path.join(run, n) for n in ("ca.key", "ca.pem", "tls.key", "tls.csr", "tls.crt"))
    newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"] if KEY == "ec" else ["-newkey", "rsa:2048"]
    sh(["openssl", "req", "-x509", *newkey, "-nodes", "-keyout", ca_key, "-out", ca, "-days", "30",
        "-subj", "/CN=tls-cost CA", "-addext", "basicConstraints=critical,CA:TRUE"])
    sh(["openssl", "req", "-new", *newkey, "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=localhost"])
    ext = os.path.join(run, "leaf.ext")
    open(ext, "w").write("basicConstraints=critical,CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")
    sh(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "30",
        "-extfile", ext, "-out", cert])
    return cert, key


def nginx(name, cpu, servers):
    d = os.path.join(run, name)
    os.makedirs(d)
    open(os.path.join(d, "nginx.conf"), "w").write(NGINX % {"d": d, "servers": servers})
    return subprocess.Popen(["taskset", "-c", cpu, "nginx", "-p", d + "/", "-e", d + "/error.log", "-c", d + "/nginx.conf"])


def workers(master):
    out = subprocess.run(["pgrep", "-P", str(master.pid)], capture_output=True, text=True).stdout.split()
    return [int(x) for x in out] or [master.pid]


def cpu_ticks(pids):
    t = 0
    for pid in pids:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        t += int(f[11]) + int(f[12])
    return t


def wrk(url, lua):
    r = subprocess.run(["taskset", "-c", "0", "wrk", "-t2", "-c64", f"-d{DUR}s", "-s", lua, url],
                       capture_output=True, text=True)
    m = re.search(r"RESULT requests=(\d+) duration_s=([\d.]+) rps=([\d.]+) err_connect=(\d+) err_read=(\d+) "
                  r"err_write=(\d+) err_status=(\d+) err_timeout=(\d+)", r.stdout)
    if not m:
        raise RuntimeError(f"wrk gave no result for {url}: {r.stdout[-500:]} {r.stderr[-500:]}")
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", r.stdout)
    errors = sum(int(m.group(i)) for i in range(4, 9))
    return int(m.group(1)), float(m.group(3)), int(non2xx.group(1)) if non2xx else 0, errors


def measure(url, pids, lua):
    wrk(url, lua)  # warm-up, same length
    t0 = cpu_ticks(pids)
    n, rps, non2xx, errors = wrk(url, lua)
    t1 = cpu_ticks(pids)
    return (t1 - t0) / os.sysconf("SC_CLK_TCK") * 1e6 / n, rps, non2xx / n, errors


def wait_port(port, proc):
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"a server on {port} exited ({proc.returncode})")
            time.sleep(0.1)
    sys.exit(f"nothing listens on {port}")


def negotiated(port):
    out = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost"],
                         input="", capture_output=True, text=True, timeout=20).stdout
    m = re.search(r"New, (\S+), Cipher is (\S+)", out)
    group = re.search(r"(?:Server Temp Key|Negotiated TLS1.3 group): (\S+?),? ", out)
    return f"{m.group(1)} {m.group(2)} {group.group(1) if group else ''}".strip() if m else "no session"


procs = []
try:
    policies = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(run, "policies")
    if len(sys.argv) <= 2:
        sh([os.path.join(ROOT, "scripts", "bench-policies.sh"), policies])
    cert, key = pki()
    keepalive_lua, close_lua = os.path.join(run, "keepalive.lua"), os.path.join(run, "close.lua")
    open(keepalive_lua, "w").write(LUA % "")
    open(close_lua, "w").write(LUA % 'wrk.headers["Connection"] = "close"')
    up_port, ng_port, sg_port, plain_port = free_port(), free_port(), free_port(), free_port()
    up = nginx("up", "0", UPSTREAM % {"port": up_port})
    procs.append(up)
    front = nginx("front", "1", FRONT % {"up": up_port, "port": ng_port, "cert": cert, "key": key})
    procs.append(front)
    serve = [EXE, "serve", "--upstream", f"http://127.0.0.1:{up_port}", "--policies", policies]
    sg = subprocess.Popen(["taskset", "-c", "1", *serve, "--listen", f"127.0.0.1:{sg_port}",
                           "--admin-listen", f"127.0.0.1:{free_port()}", "--tls-cert", cert, "--tls-key", key],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(sg)
    plain = subprocess.Popen(["taskset", "-c", "1", *serve, "--listen", f"127.0.0.1:{plain_port}",
                              "--admin-listen", f"127.0.0.1:{free_port()}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(plain)
    for port, proc in ((up_port, up), (ng_port, front), (sg_port, sg), (plain_port, plain)):
        wait_port(port, proc)
    print(f"# {KEY} certificate; negotiated by OpenSSL's client: nginx {negotiated(ng_port)}, "
          f"shedgate {negotiated(sg_port)}", flush=True)
    contenders = [
        ("nginx TLS", "keep-alive", f"https://127.0.0.1:{ng_port}/ingest", lambda: workers(front), keepalive_lua),
        ("shedgate TLS", "keep-alive", f"https://127.0.0.1:{sg_port}/ingest", lambda: [sg.pid], keepalive_lua),
        ("shedgate plain", "keep-alive", f"http://127.0.0.1:{plain_port}/ingest", lambda: [plain.pid], keepalive_lua),
        ("nginx TLS", "new connection", f"https://127.0.0.1:{ng_port}/ingest", lambda: workers(front), close_lua),
        ("shedgate TLS", "new connection", f"https://127.0.0.1:{sg_port}/ingest", lambda: [sg.pid], close_lua),
    ]
    results = {}
    for r in range(ROUNDS):
        order = contenders if r % 2 == 0 else contenders[::-1]
        for name, mode, url, pids, lua in order:
            us, rps, non2xx, errors = measure(url, pids(), lua)
            results.setdefault((name, mode), []).append(us)
            print(f"round {r + 1} {name:15s} {mode:15s} {rps:8.0f} req/s {us:8.1f} us/req  non-2xx {non2xx:.1%}"
                  f"  socket errors {errors}", flush=True)
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGQUIT if p.args[3:4] == ["nginx"] else signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    shutil.rmtree(run, ignore_errors=True)


def quartiles(xs):
    xs = sorted(xs)
    return xs[len(xs) // 4], xs[len(xs) // 2], xs[(3 * len(xs)) // 4]


print(f"## medians of {ROUNDS} rounds of {DUR} s, CPU us on the server's core (quartiles)")
out = []
for name in ("nginx TLS", "shedgate TLS", "shedgate plain"):
    keep = results[(name, "keep-alive")]
    q = quartiles(keep)
    row = {"server": name, "keepalive_us": q[1], "keepalive_q": [q[0], q[2]]}
    line = f"{name:15s} request, keep-alive {q[1]:7.1f} ({q[0]:.1f}-{q[2]:.1f})"
    if (name, "new connection") in results:
        conn = results[(name, "new connection")]
        c = quartiles(conn)
        h = quartiles([b - a for a, b in zip(keep, conn)])
        row.update(connection_us=c[1], connection_q=[c[0], c[2]], handshake_us=h[1], handshake_q=[h[0], h[2]])
        line += f"   new connection {c[1]:7.1f} ({c[0]:.1f}-{c[2]:.1f})   its handshake {h[1]:7.1f} ({h[0]:.1f}-{h[2]:.1f})"
    print(line)
    out.append(row)
print("\n| server | request, keep-alive µs | new connection µs | its handshake µs |\n|---|---|---|---|")
for row in out:
    conn = f"{row['connection_us']:.1f}" if "connection_us" in row else "–"
    shake = f"{row['handshake_us']:.1f}" if "handshake_us" in row else "–"
    print(f"| {row['server']} | {row['keepalive_us']:.1f} | {conn} | {shake} |")
print("JSON " + json.dumps(out))
