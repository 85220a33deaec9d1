"""Parse a `vllm bench serve` argv (after "bench serve") with the parser of the vLLM this interpreter imports
(vllm.benchmarks.serve.add_cli_args, as `vllm bench serve` builds it). stdout (last line): {"vllm": version,
"ok": bool, "args": {flag dest: value}}."""

from __future__ import annotations

import json
import sys

import vllm
from vllm.benchmarks.serve import add_cli_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

parser = FlexibleArgumentParser(prog="vllm bench serve")
add_cli_args(parser)
try:
    ns = parser.parse_args(sys.argv[1:])
except SystemExit:
    print(json.dumps({"vllm": vllm.__version__, "ok": False}))
    sys.exit(0)
print(json.dumps({"vllm": vllm.__version__, "ok": True,
                  "args": {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, type(None)))}}))
