"""The adaptive-verification acceptance run on an MI300-class host (three arms: no speculation, block, adaptive).

    python validation/run_av_acceptance.py --model V4.1-Flash --concurrency 16 --report /var/tmp/acceptance

The same as `python -m rocm_dspark.validate.av_acceptance` (see there for the arms, the checks and the report).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rocm_dspark.validate.av_acceptance import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
