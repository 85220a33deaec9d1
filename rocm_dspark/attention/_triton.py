"""Launch the Triton kernels compiled on a GPU, or in the Triton interpreter for CPU tensors.

Triton picks interpreter-or-compiler when each @triton.jit function is decorated (from
TRITON_INTERPRET), including its own standard library, so a process that imported triton in
compile mode (vLLM does) cannot normally interpret. CPU tensors cannot run compiled Triton
anyway, so for them we run the kernel through `InterpretedFunction` and, for the duration of
the launch, let nested @jit calls (our helpers, tl.sum, tl.max, ...) run interpreted too. The
process environment is never changed: tests, the probe's CPU self check and vLLM processes
all work whatever was imported first.
"""

from __future__ import annotations

import contextlib
import functools
import threading

_LOCK = threading.Lock()


def _is_cpu(device) -> bool:
    return getattr(device, "type", str(device)) == "cpu"


def interpreting() -> bool:
    """True when TRITON_INTERPRET made every @triton.jit function an interpreted one."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def interpreted(device) -> bool:
    """True when a launch on `device` runs in the interpreter (then dot operands are upcast to fp32)."""
    return _is_cpu(device) or interpreting()


@functools.cache
def _interpreted(fn):
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(fn)


@contextlib.contextmanager
def _nested_jit_calls_interpreted():
    from triton.runtime.errors import InterpreterError
    from triton.runtime.jit import JITFunction

    original = JITFunction.__call__
    patched: set[int] = set()

    def call(self, *args, **kwargs):  # only reached from inside an interpreted kernel
        interp = _interpreted(self.fn)
        rewrite = getattr(interp, "rewrite", None)
        if id(self.fn) not in patched or rewrite is None:
            patched.add(id(self.fn))
            return interp(*args, **kwargs)
        # InterpretedFunction.__call__ (triton/runtime/interpreter.py) re-patches triton.language on every device
        # call and never undoes it, so within one launch the first call's patch still holds: skip the re-patch
        # (an inspect.getmembers scan per call: about a tenth of the CPU self check's CPU time, same results).
        try:
            return rewrite()(*args, **kwargs)
        except Exception as e:
            raise InterpreterError(repr(e)) from e

    with _LOCK:
        JITFunction.__call__ = call
        try:
            yield
        finally:
            JITFunction.__call__ = original


def launch(kernel, grid, device, *args, **kwargs):
    """kernel[grid](*args, **kwargs), interpreted when the tensors live on the CPU."""
    if _is_cpu(device) and not interpreting():
        kwargs.pop("num_warps", None)
        with _nested_jit_calls_interpreted():
            return _interpreted(kernel.fn)[grid](*args, **kwargs)
    return kernel[grid](*args, **kwargs)
