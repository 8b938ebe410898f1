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
