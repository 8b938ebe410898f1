#!/usr/bin/env python3
"""Ablation of the pressure controller: remove rules one at a time, cumulatively, or perturb
tuned values, and judge each change on the fleet bench (seeds 1-40) and on every closed-loop
scenario test, with no rebuild (the values are read from `--tuning` / `SHEDGATE_TUNING`).

    scripts/ablation.py remove  STEPS_FILE   # cumulative: each kept removal stays removed
    scripts/ablation.py perturb NAMES...     # each name at x0.5 and x2 of its default, alone

STEPS_FILE has one step per line: `label<TAB>NAME=VALUE,NAME=VALUE`. A step is *needed* when a
scenario test fails, or a fleet case meets its targets at 4 or more fewer seeds of 40, or
returns to pressure <= 0.5 within 3 s at 2 or more fewer seeds, or a phase's p99 median rises
by more than 15%, or a not-shed phase's most shed rises by more than 1 point. A removal that is
not needed stays removed for the later steps (two rules that each look unneeded alone may be
needed together). Results go to stdout as a Markdown table and, per step, to
target/ablation/<remove|perturb>/<label>.{fleet,tests}.txt.

Builds first (`cargo bench --bench fleet --no-run`, `cargo test --no-run`). A removal runs the
bench and the tests side by side (two cores), about a minute; a perturbation runs the tests
first and the bench only if they pass. docs/pressure.md "Ablation" has the results.
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "target", "ablation")
TESTS = ["scenarios::", "low_signal::", "replicas::", "harness::", "stream_costs::"]


def executable(args, name):
    """The path of the executable of target `name` that `cargo <args> --no-run` builds."""
    out = subprocess.run(
        ["cargo", *args, "--no-run", "--message-format=json"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    paths = [
        m["executable"]
        for m in map(json.loads, out.splitlines())
        if m.get("reason") == "compiler-artifact" and m.get("executable")
        and m["target"]["name"] == name
    ]
    return paths[-1]


def parse_fleet(text):
    """{case: {"met": n, "recovered": n or None, "phases": {phase: (p99 med, shed most)}}}."""
    cases = {}
    case = None
    for line in text.splitlines():
        m = re.match(r"^(\S.*): met at (\d+) of 40 seeds", line)
        if m:
            case = {"met": int(m.group(2)), "recovered": None, "phases": {}}
            cases[m.group(1)] = case
            continue
        if case is None:
            continue
        m = re.match(r"^  pressure back .* at (\d+) of 40 seeds", line)
        if m:
            case["recovered"] = int(m.group(1))
            continue
        # The phase's own shed figure is the first "shed median"; the second is ranks 1-10's.
        m = re.match(r"^  (\S.*?) \[.*?p99 median (\d+|inf) ms.*?; shed median [\d.]+%, most ([\d.]+)%", line)
        if m:
            case["phases"][m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return cases


def verdict(base, now):
    """The reasons `now` is worse than `base` (empty: no worse)."""
    why = []
    if now is None:
        return why
    for name, b in base.items():
        n = now.get(name)
        if n is None:
            why.append(f"{name}: missing")
            continue
        if n["met"] <= b["met"] - 4:
            why.append(f"{name}: met {b['met']}->{n['met']}")
        if b["recovered"] is not None and n["recovered"] is not None and n["recovered"] <= b["recovered"] - 2:
            why.append(f"{name}: recovered {b['recovered']}->{n['recovered']}")
        for phase, (p99, most) in b["phases"].items():
            if phase not in n["phases"]:
                why.append(f"{name} {phase}: missing")
                continue
            p99n, mostn = n["phases"][phase]
            if p99n > p99 * 1.15:
                why.append(f"{name} {phase}: p99 median {p99:g}->{p99n:g} ms")
            not_shed = "slow" in phase
            if not_shed and mostn > most + 1.0:
                why.append(f"{name} {phase}: most shed {most}->{mostn}%")
    return why


def run_step(fleet, tests, label, overrides, tests_first=False):
    out = os.path.join(OUT, sys.argv[1])
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, SHEDGATE_TUNING=overrides)
    with open(os.path.join(out, f"{label}.fleet.txt"), "w") as f_out, open(
        os.path.join(out, f"{label}.tests.txt"), "w"
    ) as t_out:
        bench_args = [fleet, "--tuning", overrides or "", "--bench"]
        if tests_first:
            # A change the tests already distinguish needs no fleet run.
            test = subprocess.run([tests, *TESTS, "--test-threads", "2"], cwd=ROOT, env=env,
                                  stdout=t_out, stderr=subprocess.STDOUT)
            bench = subprocess.run(["true"] if test.returncode else bench_args, cwd=ROOT, env=env,
                                   stdout=f_out, stderr=subprocess.STDOUT)
        else:
            bench = subprocess.Popen(bench_args, cwd=ROOT, env=env, stdout=f_out,
                                     stderr=subprocess.STDOUT)
            test = subprocess.run([tests, *TESTS, "--test-threads", "1"], cwd=ROOT, env=env,
                                  stdout=t_out, stderr=subprocess.STDOUT)
            bench.wait()
    with open(os.path.join(out, f"{label}.tests.txt")) as t:
        text = t.read()
        failed = re.findall(r"^test (\S+) \.\.\. FAILED", text, re.M)
        if test.returncode != 0 and not failed or "test result:" not in text:
            failed.append("the scenario tests did not run (see %s.tests.txt)" % label)
    with open(os.path.join(out, f"{label}.fleet.txt")) as f:
        cases = parse_fleet(f.read())
    if tests_first and failed:
        cases = None
    if bench.returncode != 0:
        failed.append("fleet bench exited %d" % bench.returncode)
    return failed, cases


def main():
    mode, rest = sys.argv[1], sys.argv[2:]
    fleet = executable(["bench", "--bench", "fleet"], "fleet")
    tests = executable(["test", "--test", "proxy"], "proxy")
    failed, base = run_step(fleet, tests, "default", "", tests_first=True)
    if failed or not base:
        sys.exit(f"the defaults fail, so nothing can be judged against them: {failed}")
    print("| step | overrides | verdict | why |\n|---|---|---|---|", flush=True)
    if mode == "remove":
        kept = []
        for line in open(rest[0]):
            if not line.strip() or line.startswith("#"):
                continue
            label, overrides = line.rstrip("\n").split("\t", 1)
            trial = ",".join(kept + [overrides])
            failed, cases = run_step(fleet, tests, label, trial)
            why = failed + verdict(base, cases)
            if why:
                print(f"| {label} | `{overrides}` | needed | {'; '.join(why)} |", flush=True)
            else:
                kept.append(overrides)
                print(f"| {label} | `{overrides}` | removed | |", flush=True)
        print(f"\nkept removed: `{','.join(kept)}`")
    else:
        defaults = dict(
            l.split("=", 1)
            for l in subprocess.run([fleet, "--print-tuning", "--bench"], cwd=ROOT, capture_output=True,
                                    text=True, check=True).stdout.split()
        )
        for name in rest:
            for factor in (0.5, 2.0):
                value = defaults[name]
                if value == "inf":
                    continue
                v = float(value) * factor
                label = f"{name}x{factor}"
                failed, cases = run_step(fleet, tests, label, f"{name}={v!r}", tests_first=True)
                why = failed + verdict(base, cases)
                print(f"| {label} | `{name}={v!r}` | {'distinguished' if why else 'no change'} | {'; '.join(why)} |",
                      flush=True)


if __name__ == "__main__":
    main()
