"""Smoke validation of a node before it takes traffic: host, software, server, speculative decoding, load.

Public API:
    run_validation(options, selection_opts, *, command=None, say=print) -> report dict
    ValidateOptions, build_checks(options), check_names(options)
The `validation/` pytest suite and `rocm-dspark validate` both drive these functions.
"""

from rocm_dspark.validate.context import ValidateOptions
from rocm_dspark.validate.runner import build_checks, check_names, run_validation

__all__ = ["ValidateOptions", "build_checks", "check_names", "run_validation"]
