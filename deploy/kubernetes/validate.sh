#!/usr/bin/env bash
# Validates every manifest in deploy/kubernetes offline against the Kubernetes API schemas
# (kubernetes-validate from PyPI, strict: unknown fields are errors). Used by .ci/run; needs
# python3 with venv and PyPI. The venv lives under target/ so a clean clone builds its own.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=target/kubernetes-validate
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet 'kubernetes-validate==1.37.0'
fi
"$venv/bin/kubernetes-validate" --strict --kubernetes-version 1.33.0 deploy/kubernetes/*.yaml
# An HPA that scales on shedgate's demand waits at least 5 minutes before scaling down: retries
# of shed requests inflate the demand, and it falls as soon as new pods absorb it.
"$venv/bin/python" - deploy/kubernetes/*.yaml <<'PY'
import sys, yaml
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc or doc.get("kind") != "HorizontalPodAutoscaler":
            continue
        names = [m.get("external", {}).get("metric", {}).get("name") for m in doc["spec"].get("metrics", [])]
        if "shedgate_upstream_demand" not in names:
            continue
        window = doc["spec"].get("behavior", {}).get("scaleDown", {}).get("stabilizationWindowSeconds", 300)
        if window < 300:
            sys.exit(f"{path}: HPA {doc['metadata']['name']} scales down on shedgate_upstream_demand after {window} s; use at least 300")
        print(f"{path}: HPA {doc['metadata']['name']}: scale-down stabilisation {window} s")
PY
# The admin listener answers only a Host that is an IP address, localhost or a name of
# --admin-allow-host (421 otherwise): a probe that sets its own Host must name an allowed one.
"$venv/bin/python" - deploy/kubernetes/*.yaml <<'PY'
import sys, yaml
for path in sys.argv[1:]:
    for doc in yaml.safe_load_all(open(path)):
        if not doc or doc.get("kind") != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"].get("containers", []):
            args = c.get("args", [])
            if "serve" not in args:
                continue
            allowed = set()
            for i, a in enumerate(args):
                if a == "--admin-allow-host" and i + 1 < len(args):
                    allowed |= {n.strip().lower().rstrip(".") for n in args[i + 1].split(",")}
            for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
                get = c.get(kind, {}).get("httpGet")
                if not get:
                    continue
                for h in get.get("httpHeaders", []):
                    if h["name"].lower() != "host":
                        continue
                    name = h["value"].rsplit(":", 1)[0].lower().rstrip(".")
                    if name != "localhost" and name not in allowed and not name.replace(".", "").isdigit():
                        sys.exit(f"{path}: {c['name']} {kind} sends Host {h['value']}, which the admin listener answers 421: add --admin-allow-host {name}")
            print(f"{path}: {c['name']}: admin probes address the listener by an answered Host")
PY
