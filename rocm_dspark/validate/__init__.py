"""Smoke validation of a node before it takes traffic: host, software, server, speculative decoding, load.

The `validation/` pytest suite and `rocm-dspark validate` both drive the functions of `__all__`.
"""

from rocm_dspark.validate.context import ValidateOptions
from rocm_dspark.validate.runner import build_checks, check_names, run_validation

__all__ = ["ValidateOptions", "build_checks", "check_names", "run_validation"]
