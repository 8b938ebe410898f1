"""testssl.sh, openssl s_client and the real clients of scripts/tls-check.py."""
import datetime
import json
import os
import re
import time

from tlscheck.stack import (NEVER_STREAM, SHED_PIN, SHEDDABLE_STREAM, WEBHOOK_SECRET, Ids, now_rfc3339,
                            run)

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
