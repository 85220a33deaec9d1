"""Level `kernel`: the attention path that will serve (ours) against the PyTorch reference (docs/probe.md).

rocm_dspark.attention.selfcheck runs a verify batch whose query lengths are trimmed on the device through our
kernels, with the host-planned negative control that must be caught, as one HIP/CUDA graph replayed per layout on
a GPU. It runs in a child Python so that a GPU fault (segfault, HIP abort) fails this level with the reason
instead of killing the probe. On a CPU-only host the kernels run in the Triton interpreter: the level can pass
(useful for testing the probe) but never counts for the gate.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from rocm_dspark.inputs import parse_json
from rocm_dspark.probe.record import LevelResult
from rocm_dspark.probe.store import iso, utc_now


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def gating_validity(result: dict) -> tuple[bool, str]:
    """(valid, note): only a ROCm GPU run with a graph replay is evidence about this host."""
    if result.get("interpreted") is not False:
        return False, "not valid for gating: ran in the Triton interpreter on CPU, not on an AMD GPU"
    if not result.get("hip_version"):
        return False, "not valid for gating: torch is not a ROCm build, so this is not an AMD GPU run"
    if not result.get("graph_replay") and result.get("passed"):
        return False, "not valid for gating: no HIP graph replay happened"
    return (
        True,
        f"valid for gating: {result.get('device_name') or 'GPU'} ({result.get('arch') or '?'}), HIP graph replay",
    )


def run_kernel(*, python: str | None = None, timeout_s: float = 1800.0, progress=lambda msg: None) -> LevelResult:
    started, t0 = utc_now(), time.monotonic()
    argv = [python or sys.executable, "-m", "rocm_dspark.probe.kernel"]
    progress("kernel: running our attention path against the PyTorch reference in a child process")
    evidence: dict = {"argv": argv}

    def result(reason: str, passed=False, valid=False, note="not valid for gating: no result") -> LevelResult:
        seconds = round(time.monotonic() - t0, 3)
        return LevelResult("kernel", passed, valid, reason, note, iso(started), seconds, evidence)

    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr or ""
        evidence["stderr_tail"] = (err.decode(errors="replace") if isinstance(err, bytes) else err)[-2000:]
        return result(f"the kernel check did not finish within {timeout_s:g} s")
    except OSError as exc:
        return result(f"cannot run {argv[0]}: {exc.strerror}")
    evidence["exit_code"] = proc.returncode
    evidence["stderr_tail"] = proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        how = (
            f"was killed by {_signal_name(proc.returncode)}"
            if proc.returncode < 0
            else f"exited with status {proc.returncode} without a result"
        )
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return result(f"the kernel check process {how} ({last})")
    try:
        found = parse_json(lines[-1], "the kernel check's result")  # evidence: no NaN, no duplicate key
    except ValueError:
        return result("the kernel check printed a result that is not JSON")
    evidence.update(found)
    valid, note = gating_validity(found)
    passed = bool(found.get("passed"))
    return result(str(found.get("reason") or ("passed" if passed else "failed")), passed, valid, note)


def main() -> int:
    """Child process: pick the device, run the self check, print one JSON line."""
    import torch

    on_gpu = torch.cuda.is_available() and (torch.version.hip is not None or torch.version.cuda is not None)
    from rocm_dspark.attention.selfcheck import run_kernel_check

    result = run_kernel_check("cuda" if on_gpu else "cpu", interpret_ok=True)
    result["torch_version"] = torch.__version__
    result["hip_version"] = torch.version.hip
    print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
