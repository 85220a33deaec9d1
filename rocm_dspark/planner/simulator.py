"""Monte-Carlo decode steps: no speculation, fixed K, and adaptive verification.

Each step every running request verifies its anchor row plus some drafts; draft j is accepted when
a uniform draw is below its conditional rate and every earlier draft was accepted; the request emits
its accepted drafts plus one token (correction or bonus). Tokens/s = all emitted tokens / all step
time. A per-batch-size K is a fixed K chosen for the batch size, so it runs as a fixed K.

What the simulator assumes (and the CLI notes say):
  * the confidence head is calibrated: the confidences the scheduler sees are the true conditional
    rates, and they are stationary (the same workload every step);
  * steady decode: `batch` requests run every step, no prefill, no EOS;
  * adaptive verification's own work (its varlen graphs, the confidence head) is charged only where the
    cost model has a term for it (the calibrated model's adaptive_ms);
  * data parallel: requests are spread evenly; every rank is charged for the largest rank's tokens
    and drafts with the same K.
All policies share the same uniform draws (common random numbers), so their differences are not noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ELEMENTS_PER_CHUNK = 1 << 20  # uniform draws generated at a time


@dataclass(frozen=True)
class Policy:
    kind: str  # "none" | "fixed" | "adaptive"
    k: int = 0  # fixed: drafts verified per request; adaptive: drafted positions (the scheduler trims)

    @property
    def label(self) -> str:
        return {"none": "no speculation", "fixed": f"fixed K={self.k}", "adaptive": f"adaptive K<={self.k}"}[self.kind]


@dataclass(frozen=True)
class SimResult:
    policy: Policy
    batch: int  # requests running per step, all ranks together
    tokens_per_s: float  # simulated
    expected_tokens_per_s: float  # exact expectation under the same step plans
    mean_acceptance_length: float  # tokens emitted per request per step (accepted drafts + 1)
    verified_drafts_per_request: float
    step_ms: float
    steps: int


def default_steps(batch: int) -> int:
    """Enough steps for about 2x10^5 request-steps (acceptance length within ~0.5%), 200 at least."""
    return int(min(20000, max(200, math.ceil(200_000 / max(batch, 1)))))


def _rate_matrix(rates, batch: int):
    import numpy as np

    arr = np.asarray(rates, dtype=np.float64)
    if arr.ndim == 1:
        arr = np.broadcast_to(arr, (batch, arr.size))
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError("rates must be one row per position, or rows [classes or requests, positions]")
    if arr.shape[0] != batch:  # request classes: requests cycle through the rows
        arr = arr[np.arange(batch) % arr.shape[0]]
    if (arr < 0).any() or (arr > 1).any():
        raise ValueError("conditional acceptance rates must lie in [0, 1]")
    return np.ascontiguousarray(arr)


def _plans(cost, conf, policy: Policy, steps: int, dp: int):
    """Per step: verified drafts per request [steps, batch] and step seconds [steps]. The confidences are
    stationary, so every step plans the same; adaptive verification's history (the previous step's
    confidences) equals the current ones."""
    import numpy as np

    from rocm_dspark.planner.scheduler import plan_step, request_seconds

    batch, gamma = conf.shape
    sizes = [batch // dp + (1 if r < batch % dp else 0) for r in range(dp)]  # requests per DP rank
    largest = max(sizes)
    if hasattr(cost, "for_requests"):  # a cost whose routing term depends on tokens per request
        cost = cost.for_requests(largest)
    per_request = request_seconds(cost, largest)
    if policy.kind == "none":
        lengths = np.zeros(batch, dtype=np.int64)
        seconds = per_request + float(cost.verify_seconds(largest))
    elif policy.kind == "fixed":
        k = min(policy.k, gamma)
        lengths = np.full(batch, k, dtype=np.int64)
        seconds = per_request + cost.draft_seconds(largest, k) + float(cost.verify_seconds(largest * (1 + k)))
    elif policy.kind == "adaptive":
        plans = [plan_step(rank, rank, cost) for rank in np.split(conf, np.cumsum(sizes)[:-1])]
        # an array of its own, not a broadcast view: the expected-token sum below keeps the summation order
        # (and so the last digit) of the planner's figures
        lengths = np.tile(np.concatenate([plan.lengths for plan in plans]), (steps, 1))
        # Adaptive verification's own work (confidence head, varlen metadata) where the cost knows it; the
        # budget search does not see it (a constant per step), as vLLM's profiled tables do not. DP ranks run
        # one graph shape (vLLM: per-rank budget, then one collective agrees the graph).
        draft = cost.draft_seconds(largest, gamma) + per_request + float(getattr(cost, "adaptive_seconds", 0.0))
        seconds = draft + float(cost.verify_seconds(max(plan.tokens for plan in plans)))
    else:
        raise ValueError(f"unknown policy {policy.kind!r}")
    return np.broadcast_to(lengths, (steps, batch)), np.full(steps, seconds)


def simulate(
    cost, rates, batch: int, policy: Policy, *, dp: int = 1, steps: int | None = None, seed: int = 0
) -> SimResult:
    """Run `steps` steady decode steps of `batch` requests under `policy` and the step cost `cost`.

    `rates` is one row of conditional rates per position, one row per request, or a few rows of request
    CLASSES that requests cycle through. When the batch does not hold every class equally often (batch 1
    with two classes), the batch is simulated once per rotation of the classes and the runs are pooled
    (tokens over time), as requests of every class pass through the batch over a server's life."""
    import numpy as np

    arr = np.asarray(rates, dtype=np.float64)
    if arr.ndim == 2 and arr.shape[0] not in (1, batch) and batch % arr.shape[0]:
        runs = [
            _simulate_one(cost, np.roll(arr, -o, axis=0), batch, policy, dp=dp, steps=steps, seed=seed + o)
            for o in range(arr.shape[0])
        ]
        time = sum(r.steps * r.step_ms for r in runs)
        emitted = sum(r.tokens_per_s * r.steps * r.step_ms for r in runs)
        expected = sum(r.expected_tokens_per_s * r.steps * r.step_ms for r in runs)
        return SimResult(
            policy=policy,
            batch=batch,
            tokens_per_s=emitted / time,
            expected_tokens_per_s=expected / time,
            mean_acceptance_length=sum(r.mean_acceptance_length * r.steps for r in runs) / sum(r.steps for r in runs),
            verified_drafts_per_request=float(np.mean([r.verified_drafts_per_request for r in runs])),
            step_ms=time / sum(r.steps for r in runs),
            steps=sum(r.steps for r in runs),
        )
    return _simulate_one(cost, rates, batch, policy, dp=dp, steps=steps, seed=seed)


def _simulate_one(
    cost, rates, batch: int, policy: Policy, *, dp: int = 1, steps: int | None = None, seed: int = 0
) -> SimResult:
    import numpy as np

    if batch <= 0:
        raise ValueError("batch must be positive")
    if dp <= 0 or dp > batch:
        raise ValueError("dp must be in [1, batch]")
    conf = _rate_matrix(rates, batch)
    gamma = conf.shape[1]
    steps = steps or default_steps(batch)
    lengths, seconds = _plans(cost, conf, policy, steps, dp)

    survival = np.cumprod(conf, axis=1)
    cum_survival = np.concatenate([np.zeros((batch, 1)), np.cumsum(survival, axis=1)], axis=1)
    expected = float((1.0 + np.take_along_axis(cum_survival, np.asarray(lengths).T, axis=1)).sum())

    rng = np.random.default_rng(seed)
    positions = np.arange(gamma)
    emitted = 0
    rows = max(1, ELEMENTS_PER_CHUNK // (batch * gamma))
    for start in range(0, steps, rows):
        stop = min(steps, start + rows)
        u = rng.random((stop - start, batch, gamma))
        verified = positions[None, None, :] < np.asarray(lengths[start:stop])[:, :, None]
        accepted = np.cumprod((u < conf[None]) & verified, axis=2).sum()
        emitted += int(accepted) + (stop - start) * batch
    total_time = float(seconds.sum())
    return SimResult(
        policy=policy,
        batch=batch,
        tokens_per_s=emitted / total_time,
        expected_tokens_per_s=expected / total_time,
        mean_acceptance_length=emitted / (steps * batch),
        verified_drafts_per_request=float(np.mean(lengths)),
        step_ms=1000.0 * total_time / steps,
        steps=steps,
    )
