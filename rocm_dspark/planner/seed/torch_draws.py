"""torch's CPU random draws, reproduced with numpy's MT19937.

The seed document draws its confidences with `torch.manual_seed(0); torch.rand(...)` and its Markov
target with `torch.randperm`. To reproduce its printed tables without making torch a dependency we
replay the same generator: torch's CPU generator is a 32-bit Mersenne Twister seeded with the
standard init_genrand (ATen CPUGeneratorImpl / mt19937), `rand` of a float32 keeps the low 24 bits of
one 32-bit draw times 2^-24 (uniform_real_distribution<float>), and `randperm(n)` for small n is a
Fisher-Yates shuffle with `random() % (n - i)` (randperm_cpu). tests/test_planner_seed_goldens.py
checks every draw against torch itself when torch is installed.
"""

from __future__ import annotations


class TorchCpuDraws:
    """The draws `torch.manual_seed(seed)` followed by rand/randperm calls would make, in order."""

    def __init__(self, seed: int):
        import numpy as np

        # numpy's legacy RandomState seeds its MT19937 with the same init_genrand; its state's pos=624 makes the
        # first draw regenerate the whole state block, exactly as a fresh mt19937 does.
        self._bits = np.random.MT19937()
        state = np.random.RandomState(seed).get_state(legacy=False)["state"]
        self._bits.state = {"bit_generator": "MT19937", "state": state}

    def _raw(self, n: int):
        import numpy as np

        return self._bits.random_raw(n).astype(np.uint32)

    def rand(self, *shape: int):
        """torch.rand(*shape) as float32, row-major like torch fills a contiguous tensor."""
        import numpy as np

        n = int(np.prod(shape)) if shape else 1
        values = (self._raw(n) & np.uint32(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)
        return values.reshape(shape)

    def randperm(self, n: int):
        """torch.randperm(n) (int64) for n small enough that torch uses its 32-bit Fisher-Yates path."""
        import numpy as np

        if n >= (2**32 - 1) // 20:
            raise ValueError("torch switches to another algorithm for n this large; not reproduced")
        perm = np.arange(n, dtype=np.int64)
        for i in range(n - 1):
            z = int(self._raw(1)[0]) % (n - i)
            perm[i], perm[i + z] = perm[i + z], perm[i]
        return perm
