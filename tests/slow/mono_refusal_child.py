"""Run vLLM 0.33.0's own `MonoDecodeLayer._create` (vllm/models/deepseek_v41/amd/mono_decode.py:346-384) on this
CPU machine and print the traceback of the refusal it raises, as a server log shows it. Only what needs a GPU is
stood in for: vllm.platforms.rocm (it reads the GPU's arch when imported, rocm.py:215) by a module whose
get_cdna_version says 3, an MI300X (rocm.py:367); the tensor parallel size (argv[1]) of the distributed group.
The layer and config are the few attributes _create reads before it refuses."""

import sys
import traceback
import types
from types import SimpleNamespace

platform = types.ModuleType("vllm.platforms.rocm")
platform.get_cdna_version = lambda: 3  # type: ignore[attr-defined]
sys.modules["vllm.platforms.rocm"] = platform

from vllm.models.deepseek_v41.amd import mono_decode  # noqa: E402

mono_decode.get_tensor_model_parallel_world_size = lambda: int(sys.argv[1])
config = SimpleNamespace(kernel_config=SimpleNamespace(monokernel=True),
                         parallel_config=SimpleNamespace(enable_expert_parallel=False, enable_eplb=False,
                                                         data_parallel_size=1))
try:
    mono_decode.MonoDecodeLayer._create(SimpleNamespace(ffn=SimpleNamespace()), config)
except ValueError:
    print(traceback.format_exc(), end="")
else:
    sys.exit("no refusal")
