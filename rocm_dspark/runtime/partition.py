"""A GPU's compute partition, as `amd-smi static --partition` prints it: the host checks read it (runtime.inventory,
validate) and the generated launcher applies the same rule (launch_facts hands it the command and the pattern).

Older amd-smi name the mode COMPUTE_PARTITION, newer ones ACCELERATOR_PARTITION, and a partition other than its
GPU's first may print N/A (https://github.com/ROCm/amdsmi/issues/100; tests/fixtures/host has all three). Every
mode but SPX makes a logical GPU of part of the XCDs
(https://instinct.docs.amd.com/projects/amdgpu-docs/en/latest/gpu-partitioning/mi300x/overview.html).
"""

import re

PARTITION_ARGV = ("amd-smi", "static", "--partition")
SPLIT_PARTITIONS = ("DPX", "TPX", "QPX", "CPX")
# A line naming a split mode, as an ERE that GNU grep -E and Python's re read alike (the launcher's copy).
SPLIT_PARTITION_RE = r"(COMPUTE|ACCELERATOR)_PARTITION: *(" + "|".join(SPLIT_PARTITIONS) + r")\b"
_GPU = re.compile(r"^GPU:\s*(\d+)\s*$")
_MODE = re.compile(r"^\s+(?:COMPUTE|ACCELERATOR)_PARTITION:\s*(\S+)")


def parse_partitions(text: str) -> dict[int, str]:
    """GPU index -> its compute partition mode (SPX, CPX, ...); a GPU that prints N/A is left out."""
    out: dict[int, str] = {}
    gpu = None
    for line in text.splitlines():
        if m := _GPU.match(line):
            gpu = int(m.group(1))
        elif gpu is not None and (m := _MODE.match(line)) and m.group(1) != "N/A":
            out[gpu] = m.group(1)
    return out
