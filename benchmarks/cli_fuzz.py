"""The CLI fuzz campaign at scale (issue #14): N random command lines (default 10^5), in process, and what they did.

    python benchmarks/cli_fuzz.py [-n 100000] [--seed 0] [--time-limit S] [--json OUT]

Prints the count of runs, exit statuses, runs per command, the rate, and every distinct finding (a traceback,
a hang, an odd exit status, a multi-line usage error) with one command line that shows it. Exit status 1 when
there is a finding. The generator and what is stubbed: tests/fuzz_cli.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz_cli import invocations, make_runner, run_one, stubs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=0, help="stop after this many seconds (0: no limit)")
    ap.add_argument("--json", default=None, help="also write the counts and findings here")
    args = ap.parse_args()

    runner = make_runner()
    codes: collections.Counter = collections.Counter()
    per_cmd: collections.Counter = collections.Counter()
    findings: dict[str, list[str]] = {}
    t0 = time.monotonic()
    done = 0

    class Stop(Exception):
        pass

    @settings(max_examples=args.n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(invocations(), st.randoms())
    def one(argv, _rnd):
        nonlocal done
        if args.time_limit and time.monotonic() - t0 > args.time_limit:
            raise Stop()
        outcome = run_one(runner, argv)
        done += 1
        codes[outcome.exit_code] += 1
        per_cmd[" ".join(a for a in argv[:2] if not a.startswith("-"))] += 1
        if outcome.finding:
            key = outcome.finding.split(": ")[0]
            if key not in findings:
                findings[key] = [outcome.finding, " ".join(map(repr, argv))]
                print(f"finding: {outcome.finding}: rocm-dspark {' '.join(map(repr, argv))}", file=sys.stderr, flush=True)
        if done % 1000 == 0:
            rate = done / (time.monotonic() - t0)
            print(f"{done} runs, {rate:.1f}/s, {len(findings)} distinct findings", file=sys.stderr, flush=True)

    def only_stop(exc: BaseException) -> bool:
        # Hypothesis replays the example that raised Stop; when the replay passes it reports FlakyFailure (an
        # exception group around Stop), which is the same end of a --time-limit run.
        if isinstance(exc, Stop):
            return True
        return isinstance(exc, BaseExceptionGroup) and all(only_stop(e) for e in exc.exceptions)

    random.seed(args.seed)
    with stubs():
        try:
            one()
        except BaseException as exc:  # noqa: BLE001 - anything but the time limit propagates
            if not only_stop(exc):
                raise
    elapsed = time.monotonic() - t0
    report = {"runs": done, "seconds": round(elapsed, 1), "rate_per_s": round(done / max(elapsed, 1e-9), 2),
              "exit_codes": {str(k): v for k, v in sorted(codes.items(), key=str)},
              "per_command": dict(per_cmd.most_common()), "distinct_findings": len(findings),
              "findings": findings}
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
