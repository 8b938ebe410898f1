#!/usr/bin/env python3
"""The access log's CPU per request: two shedgate processes side by side, one without a log
and one writing every line to a file, measured in alternation in the same rounds (the 2-core
VM's CPU cost drifts by a fifth between runs, so separate runs of costofno.py cannot tell a few
percent). The method is ../shared/bench/costofno.py's: wrk (2 threads, 64 connections, the
shared harness's 312-byte vehicle.position POST) on core 0, the proxy under test on core 1, CPU
from /proc/PID/stat over the run; the upstream is nginx `return 204` on core 0.

Per round and proxy: a yes (sheddable, forwarded), a `never` yes (streamed, unread) and a no
(pinned 0.8: read, ranked, shed). The log file is truncated before each measurement, as a
rotation would. Prints each measurement with the writer thread's share, then the medians and
the log's cost as a share.

Usage (project root): scripts/costoflog.py target/release/shedgate POLICIES [LOG_FLAGS...]
(POLICIES from scripts/bench-policies.sh; DUR seconds per run, default 6; ROUNDS, default 5;
PATHS, a comma-separated subset of yes,never-yes,no, default all three;
LOG_FLAGS default `--access-log $TMP/access.log`). Needs wrk, nginx and taskset; binds
127.0.0.1:18380-18382 and 19381-19382."""
import json, os, re, shutil, signal, subprocess, sys, tempfile, time, urllib.request

EXE, POL = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
DUR = int(os.environ.get("DUR", "6"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench")
run = tempfile.mkdtemp(prefix="costoflog-")
LOG = os.path.join(run, "access.log")
LOG_FLAGS = sys.argv[3:] or ["--access-log", LOG]
CONF = """user root; worker_processes 1; daemon off; pid %(d)s/nginx.pid; error_log %(d)s/error.log crit;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 10000000; keepalive_timeout 65s;
  client_body_temp_path %(d)s/b; proxy_temp_path %(d)s/p; fastcgi_temp_path %(d)s/f; uwsgi_temp_path %(d)s/u; scgi_temp_path %(d)s/s;
  server { listen 127.0.0.1:18380 backlog=4096; location / { return 204; } } }
"""


def wrk(port, lua):
    r = subprocess.run(["taskset", "-c", "0", "wrk", "-t2", "-c64", f"-d{DUR}s", "-s", lua,
                        f"http://127.0.0.1:{port}/ingest"], capture_output=True, text=True)
    m = re.search(r"RESULT requests=(\d+) duration_s=([\d.]+) rps=([\d.]+)", r.stdout)
    return int(m.group(1)), float(m.group(3))


def ticks(pid):
    """CPU ticks of the process's threads: the access-log writer's apart from the rest."""
    writer = rest = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            f = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        t = int(f[11]) + int(f[12])
        if name == "access-log":
            writer += t
        else:
            rest += t
    return writer, rest


def measure(proc, port, lua):
    wrk(port, lua)  # warm-up, same length
    # A log rotated away: the file does not grow over the whole run (at 30 MB/s, gigabytes,
    # whose page-cache pressure would be charged to whichever run comes last).
    if os.path.exists(LOG):
        os.truncate(LOG, 0)
    (w0, r0) = ticks(proc.pid)
    n, rps = wrk(port, lua)
    (w1, r1) = ticks(proc.pid)
    hz = os.sysconf("SC_CLK_TCK")
    return ((w1 - w0) + (r1 - r0)) / hz * 1e6 / n, rps, (w1 - w0) / hz * 1e6 / n


def admin(port, pin):
    body = json.dumps({"pin": pin}).encode() if pin is not None else None
    # urllib labels a body form-urlencoded unless told: the admin listener wants JSON.
    req = urllib.request.Request(f"http://127.0.0.1:{port}/pressure", data=body,
                                 headers={"Content-Type": "application/json"},
                                 method="PUT" if pin is not None else "DELETE")
    urllib.request.urlopen(req, timeout=2)


d = os.path.join(run, "up")
os.makedirs(d)
open(os.path.join(d, "nginx.conf"), "w").write(CONF % {"d": d})
up = subprocess.Popen(["taskset", "-c", "0", "nginx", "-p", d + "/", "-e", d + "/error.log", "-c", d + "/nginx.conf"])
procs = {}
for name, port, flags in (("log off", 18381, []), ("log on", 18382, LOG_FLAGS)):
    procs[name] = (subprocess.Popen(
        ["taskset", "-c", "1", EXE, "serve", "--listen", f"127.0.0.1:{port}", "--upstream", "http://127.0.0.1:18380",
         "--policies", POL, "--admin-listen", f"127.0.0.1:{port + 1000}", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port)
paths = tuple(p for p in (("yes", "post.lua", None), ("never yes", "never.lua", None), ("no", "no.lua", 0.8))
              if p[0].replace(" ", "-") in os.environ.get("PATHS", "yes,never-yes,no").split(","))
results = {}
try:
    time.sleep(1.5)
    for r in range(ROUNDS):
        for path, lua, pin in paths:
            # Alternate which goes first: the second of a pair ran slower by up to a tenth in
            # an A/A run (both without a log), whichever it was.
            order = list(procs.items())
            if r % 2:
                order.reverse()
            for name, (proc, port) in order:
                admin(port + 1000, pin)
                us, rps, writer = measure(proc, port, os.path.join(BENCH, lua))
                results.setdefault((path, name), []).append(us)
                results.setdefault((path, name, "writer"), []).append(writer)
                print(f"round {r + 1} {path:10s} {name:8s} {rps:9.0f} req/s {us:6.2f} us/req "
                      f"(writer thread {writer:5.2f})", flush=True)
finally:
    for proc, _ in procs.values():
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    up.send_signal(signal.SIGQUIT)
    up.wait(10)
    shutil.rmtree(run, ignore_errors=True)
print(f"## medians of {ROUNDS} rounds of {DUR} s, CPU us per request; the cost is the median of "
      f"the rounds' differences, with their quartiles")
out = []
for path, _, _ in paths:
    offs, ons = results[(path, "log off")], results[(path, "log on")]
    off, on = sorted(offs)[ROUNDS // 2], sorted(ons)[ROUNDS // 2]
    diffs = sorted(b - a for a, b in zip(offs, ons))
    cost, q1, q3 = diffs[ROUNDS // 2], diffs[ROUNDS // 4], diffs[(3 * ROUNDS) // 4]
    writer = sorted(results[(path, "log on", "writer")])[ROUNDS // 2]
    print(f"{path:10s} log off {off:6.2f}  log on {on:6.2f}  cost {cost:+5.2f} us ({cost / off:+.1%}, "
          f"quartiles {q1:+.2f} to {q3:+.2f}); the writer thread alone {writer:5.2f} us ({writer / off:.1%})")
    out.append({"path": path, "off_us": off, "on_us": on, "cost_us": cost, "q1_us": q1, "q3_us": q3,
                "writer_us": writer})
print("JSON " + json.dumps(out))
