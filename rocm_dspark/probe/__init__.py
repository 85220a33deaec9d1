"""The validated startup probe that gates `enable_adaptive_verification`.

The upstream advice on AMD is "turn adaptive verification on only once a serve with it has started".
`rocm-dspark probe` gathers that evidence on the host, writes it as a fingerprinted record, and the
gate turns the flag on only when a record matching this host and plan holds complete evidence.

Modules (one capability each):
    fingerprint  the fields a record must match, read cheaply (no torch/vllm import)
    record       the record's JSON schema: build, content hash, strict parse
    store        the state directory: where records live, atomic writes, newest first
    gate         records -> Verdict for resolve() (on the `rocm-dspark recipe` path: stays light)
    static       level 1: host, versions, plugin, and vLLM's own adaptive-verification checks
    kernel       level 2: our attention path vs the PyTorch reference on trimmed layouts (child process)
    live         level 3: start vLLM with the adaptive argv, check answers and spec-decode counters
    run          levels -> record, the library behind `rocm-dspark probe`
    inimage      `rocm-dspark probe` run inside an image, on the software that will serve (`up`)
    evidence     the fields the gate reads from a level, typed
    serving      whether a running server is the plan's own command (the live level on `up`'s server)
    rescore      the re-scoring reference: a speculating server's greedy tokens against its own model's
    software     the software a record is made under (vLLM, torch, ROCm), read in this Python or an image
    listing      where records are, and which names are candidates (nothing opened)
    show         `probe --show` and the probe's summary
    ab_record, ab_band, payoff     the A/B record, the acceptance band it measured, and the gate's payoff half
    calibration_record             this host's `plan --calibrate` fit, signed

Importing this package is cheap; the levels import their heavy parts lazily.
"""
