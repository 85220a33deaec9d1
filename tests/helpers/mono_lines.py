"""vLLM 0.33.0's mono decode log lines, formatted from its own `logger.info_once` format strings
(vllm/models/deepseek_v41/amd/mono_decode.py, copied with their lines; tests/test_mono_log.py checks the copies
against the unpacked wheel) in vLLM's log format (vllm/logger.py:28-32)."""

from __future__ import annotations

from pathlib import Path

WHEEL = Path(__file__).resolve().parents[2] / ".cache" / "vllm-0.33.0" / "vllm" / "models" / "deepseek_v41" / "amd" / "mono_decode.py"
FORMATS = {  # mono_decode.py line -> the format string as the wheel writes it (adjacent literals joined)
    427: "DSv4.1 mono decode off for some layers: %s",
    439: "DSv4.1 mono decode: the FFN launch for the DSpark draft layers (%d / %d routing)",
    464: "DSv4.1 mono decode off for the draft layers: %s",
    468: "DSv4.1 mono decode: the FFN launch for layers with %s",
    477: "DSv4.1 mono decode: the DSpark draft layers",
    486: "DSv4.1 mono decode: the whole standard backbone layers",
    694: "DSv4.1 mono decode %slayer active (decode steps of <= %d rows)",
    763: "DSv4.1 mono decode FFN launch active (decode steps of <= %d rows)",
}


def line(at: int, *args, proc: str = "Worker_TP0 pid=4242") -> str:
    """One log line as vLLM prints it: `(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s
    [%(fileinfo)s:%(lineno)d] %(message)s` (vllm/logger.py:28-32)."""
    return f"({proc}) INFO 12-02 14:03:11 [mono_decode.py:{at}] " + FORMATS[at] % args


START = "rocm-dspark[svc]: starting vLLM with block verification (command in /s/vllm_command.txt, log in /s/block.log)"
GFX950_WHOLE = [START, line(486), line(486, proc="Worker_TP1 pid=4243"), line(477), "INFO ready",
                line(694, "", 48), line(694, "draft ", 48), line(763, 48)]
