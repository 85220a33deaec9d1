"""Child process for tests/slow/test_vllm_args_real.py: parse argvs with vLLM's real `vllm serve` parser.

stdin: JSON list of argv lists (each starting with "vllm", "serve"). stdout (last line): JSON list with, per argv,
either {"error": "..."} (vLLM refused it) or {dest: value} for the plan-owned dests given on argv[1].
With `--options` after the dests: {dest: [option strings]} of the serve parser instead.
"""

import contextlib
import io
import json
import sys

try:  # vLLM 0.33 moved the serve parser
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

DESTS = json.loads(sys.argv[1])
CC_KEYS = ("max_cudagraph_capture_size", "cudagraph_capture_sizes")


def parser():
    top = FlexibleArgumentParser()
    sub = top.add_subparsers(dest="subparser")
    make_arg_parser(sub.add_parser("serve"))
    return top


def plain(value):
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return repr(value)


def main():
    if sys.argv[2:] == ["--options"]:  # the option strings of each dest, instead of parsing
        options = {}
        for action in parser()._subparsers._group_actions[0].choices["serve"]._actions:
            if action.dest in DESTS:
                options.setdefault(action.dest, []).extend(action.option_strings)
        print(json.dumps(options))
        return
    argvs = json.load(sys.stdin)
    out = []
    for argv in argvs:
        p = parser()  # fresh: FlexibleArgumentParser keeps state between parses
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = p.parse_args(argv[1:])
        except SystemExit:
            out.append({"error": err.getvalue().strip().splitlines()[-1:] or ["exit"]})
            continue
        except Exception as exc:  # noqa: BLE001 - vLLM raises ValueError for some refusals
            out.append({"error": [f"{type(exc).__name__}: {exc}"]})
            continue
        row = {d: plain(getattr(ns, d, None)) for d in DESTS}
        cc = getattr(ns, "compilation_config", None)
        for key in CC_KEYS:
            row[f"compilation_config.{key}"] = plain(getattr(cc, key, None) if cc is not None and not isinstance(cc, dict)
                                                     else (cc or {}).get(key))
        out.append(row)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
