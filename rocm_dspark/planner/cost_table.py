"""A measured step-cost table: token count -> milliseconds, read the way vLLM 0.33 reads its own.

vLLM profiles the verify curve (target forward per captured token count) and the draft curve (drafter per request
count) and plans with step = draft_cost[num_requests] + verify_cost[tokens]; this module follows its table rules
(`build_cost_tables_from_curves`, checked against the real function in tests/test_planner_vllm.py; the rules:
docs/scheduler.md, "vLLM 0.33.0's cost tables"). A SPARSE table (a few sizes, e.g. the step times `rocm-dspark
validate` measures) is not vLLM's profile: stepping up to the next sample would charge a 17-token step what a
128-token step costs, so the step is padded to the capture grid and its cost interpolated between the samples
around it (flat below the first, extrapolated past the last); `MeasuredCost.notes()` warns for padded sizes far
from every sample. A table is dense when it has a sample at every captured size up to the largest it covers.

File formats (`--cost-table`):
  JSON  {"verify": [[tokens, ms], ...], "draft": [[num_requests, ms], ...], "capture_sizes": [...]}
        ("draft" and "capture_sizes" are optional; "includes_draft": true says the verify curve is whole
        step times with the drafter inside; "source", "note" and "samples" are kept for people)
  CSV   a header with `tokens,ms` and one row per sample (the verify curve only)
Without a draft curve the drafter is taken as free, which flatters speculation: record it if you can.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from rocm_dspark.errors import UsageError

MIN_VERIFY_MS = 1e-6  # vLLM's floor on the verify table


def lookup_ms(curve, sizes, limit: int = 0, *, sparse: bool = False):
    """Cost in ms of each size in `sizes` from (size, ms) samples sorted by size, costs made monotone first.
    vLLM's rules: at or below `limit` the cost of the smallest sample >= size, above it linear between the
    samples above it. `sparse`: linear between all samples, flat below the first. Either way, linear
    extrapolation from the last two samples past the last."""
    import numpy as np

    xs = np.asarray([x for x, _ in curve], dtype=np.float64)
    ys = np.maximum.accumulate(np.asarray([y for _, y in curve], dtype=np.float64))
    values = np.asarray(sizes, dtype=np.float64)
    if sparse:
        result = np.interp(values, xs, ys)
    else:
        result = ys[np.minimum(np.searchsorted(xs, values, side="left"), len(xs) - 1)]
        smooth, above = values > limit, xs > limit
        if limit and smooth.any() and above.any():
            result = np.where(smooth, np.interp(values, xs[above], ys[above]), result)
    if len(xs) > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        result = np.where(values > xs[-1], ys[-1] + slope * (values - xs[-1]), result)
    return result


def _median_by_size(rows, what: str, source: str):
    """Sorted (size, median ms) pairs; sizes must be positive integers and costs non-negative."""
    import statistics

    by_size: dict[int, list[float]] = {}
    for size, ms in rows:
        if size <= 0 or int(size) != size:
            raise UsageError(f"{source}: {what} size {size!r} is not a positive integer")
        if not ms >= 0:
            raise UsageError(f"{source}: {what} cost {ms!r} ms at size {size} is not a non-negative number")
        by_size.setdefault(int(size), []).append(float(ms))
    if not by_size:
        raise UsageError(f"{source}: the {what} curve has no samples; add rows of [size, ms]")
    return tuple((s, statistics.median(v)) for s, v in sorted(by_size.items()))


@dataclass(frozen=True)
class MeasuredCost:
    """Step cost from measured curves (ms), same interface as RooflineCost (seconds)."""

    verify_ms: tuple[tuple[int, float], ...]
    draft_ms: tuple[tuple[int, float], ...] = ()
    capture_sizes: tuple[int, ...] = ()
    label: str = "measured cost table"
    includes_draft: bool = False

    @classmethod
    def from_samples(
        cls, verify, draft=(), capture_sizes=(), label="measured cost table", source="cost table", includes_draft=False
    ):
        sizes = tuple(sorted({int(s) for s in capture_sizes}))
        if any(s <= 0 for s in sizes):
            raise UsageError(f"{source}: capture_sizes must be positive integers")
        return cls(
            verify_ms=_median_by_size(verify, "verify", source),
            draft_ms=_median_by_size(draft, "draft", source) if draft else (),
            capture_sizes=sizes,
            label=label,
            includes_draft=bool(includes_draft),
        )

    @property
    def dense(self) -> bool:
        """A sample at every captured size up to the largest sample at or below the capture limit
        (vLLM's own profile), or nothing captured: vLLM's step rule applies. Else: sparse."""
        if not self.capture_sizes:
            return True
        have = {s for s, _ in self.verify_ms}
        top = max((s for s in have if s <= self.cudagraph_limit), default=0)
        return all(s in have for s in self.capture_sizes if s <= top)

    def far_sizes(self, sizes, ratio: float = 2.0) -> list[int]:
        """Padded sizes more than `ratio` x away from the nearest sample (sparse tables only)."""
        import numpy as np

        from rocm_dspark.planner.roofline import pad_to_capture

        if self.dense:
            return []
        xs = np.asarray([s for s, _ in self.verify_ms], dtype=np.float64)
        padded = sorted({int(v) for v in np.atleast_1d(pad_to_capture(sizes, self.capture_sizes)) if v > 0})
        return [size for size in padded if float(np.min(np.maximum(xs / size, size / xs))) > ratio]

    def notes(self) -> list[str]:
        samples = ", ".join(str(s) for s, _ in self.verify_ms)
        if self.dense:
            out = [f"cost table: samples at every captured size ({len(self.verify_ms)}): vLLM's step rule"]
        else:
            out = [
                f"cost table: sparse ({len(self.verify_ms)} samples at {samples} tokens): steps are padded to the "
                f"capture grid, then interpolated linearly between samples (flat below {self.verify_ms[0][0]}, "
                f"extrapolated past {self.verify_ms[-1][0]})"
            ]
        if self.includes_draft:
            out.append(
                "cost table: its step times include the drafter of the launch it was measured on, so a plan "
                "without speculation is charged for a drafter, and other K for the measured one"
            )
        return out

    @property
    def cudagraph_limit(self) -> int:
        """The largest captured size (0: nothing captured, the samples alone define the steps)."""
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def verify_seconds(self, tokens):
        import numpy as np

        from rocm_dspark.planner.roofline import pad_to_capture

        ms = lookup_ms(
            self.verify_ms, pad_to_capture(tokens, self.capture_sizes), self.cudagraph_limit, sparse=not self.dense
        )
        return np.maximum(ms, MIN_VERIFY_MS) / 1000.0

    def draft_seconds(self, num_requests: int, k: int) -> float:
        """vLLM's draft curve is keyed by request count only: a DSpark block is one drafter forward."""
        if k <= 0 or num_requests <= 0 or not self.draft_ms:
            return 0.0
        return max(float(lookup_ms(self.draft_ms, [num_requests], self.cudagraph_limit)[0]), 0.0) / 1000.0


# Sanity bounds on a measured table (1e308 overflowed the interpolation to inf and then 0/0): a step size is a
# token count vLLM indexes with int32; one step of more than 1000 s is no measurement of a serving step.
MAX_SIZE = (1 << 31) - 1
MAX_STEP_MS = 1e6
JSON_KEYS = ("verify", "draft", "capture_sizes", "note", "source", "samples", "includes_draft", "schema")


def _number(value, source: str, where: str, limit: float = MAX_SIZE) -> float:
    if isinstance(value, bool):  # float(True) is 1.0: JSON's true is no token count or time
        raise UsageError(f"{source}: {where}: {str(value).lower()} is a boolean, not a number")
    if isinstance(value, str) and len(value) > 64:
        raise UsageError(f"{source}: {where}: a {len(value)}-character value is not a number")
    try:
        out = float(value)
    except OverflowError:  # a JSON integer past float range
        raise UsageError(
            f"{source}: {where}: a {len(str(value))}-digit number is out of range (at most {limit:.0f})"
        ) from None
    except (TypeError, ValueError):
        raise UsageError(f"{source}: {where}: {value!r} is not a number") from None
    if out != out or out in (float("inf"), float("-inf")):
        raise UsageError(f"{source}: {where}: {value!r} is not a finite number")
    if abs(out) > limit:
        raise UsageError(f"{source}: {where}: {out:g} is out of range (at most {limit:.0f})")
    return out


def _pairs(value, source: str, key: str):
    if not isinstance(value, list):
        raise UsageError(f"{source}: {key!r} must be a list of [size, ms] pairs")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise UsageError(f"{source}: {key}[{i}] must be a [size, ms] pair, got {item!r}")
        out.append(
            (_number(item[0], source, f"{key}[{i}][0]"), _number(item[1], source, f"{key}[{i}][1]", MAX_STEP_MS))
        )
    return out


def load_cost_table(path, *, capture_sizes=()) -> MeasuredCost:
    """Read a JSON or CSV cost table; any problem is a one-line UsageError naming the file."""
    p = Path(path)
    source = str(p)
    from rocm_dspark.inputs import parse_json, read_text

    if not p.exists() and not p.is_symlink():
        raise UsageError(f"cost table {source} does not exist; pass a JSON or CSV file of tokens -> ms")
    text = read_text(p, "cost table")
    if p.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        data = parse_json(text, source)
        if not isinstance(data, dict) or "verify" not in data:
            raise UsageError(f'{source}: expected an object with a "verify" list of [tokens, ms] pairs')
        unknown = set(data) - set(JSON_KEYS)
        if unknown:
            raise UsageError(f"{source}: unknown keys {sorted(unknown)}; expected verify, draft, capture_sizes")
        verify = _pairs(data["verify"], source, "verify")
        draft = _pairs(data["draft"], source, "draft") if data.get("draft") else []
        sizes = data.get("capture_sizes") or capture_sizes
        if not isinstance(sizes, (list, tuple)):
            raise UsageError(f"{source}: capture_sizes must be a list of token counts")
        sizes = [_number(s, source, "capture_sizes") for s in sizes]
        if any(s != int(s) for s in sizes):
            raise UsageError(f"{source}: capture_sizes must be integers")
    else:
        try:
            rows = list(csv.reader(line for line in text.splitlines() if line.strip() and not line.startswith("#")))
        except csv.Error as exc:  # e.g. a field past csv.field_size_limit() (a 2 MB cell)
            raise UsageError(f"{source}: not a CSV cost table ({exc}); expected rows of tokens,ms") from None
        if not rows:
            raise UsageError(f"{source}: empty cost table; expected a header `tokens,ms` and rows")
        header = [h.strip().lower() for h in rows[0]]
        if "tokens" not in header or "ms" not in header:
            raise UsageError(f"{source}: the CSV header must name the columns tokens and ms, got {rows[0]!r}")
        it, im = header.index("tokens"), header.index("ms")
        verify = []
        for n, row in enumerate(rows[1:], start=2):
            if len(row) <= max(it, im):
                raise UsageError(f"{source}: row {n} has {len(row)} columns, expected {len(header)}")
            verify.append(
                (_number(row[it], source, f"row {n} tokens"), _number(row[im], source, f"row {n} ms", MAX_STEP_MS))
            )
        draft, sizes = [], capture_sizes
        data = {}
    includes_draft = data.get("includes_draft", False)
    if not isinstance(includes_draft, bool):
        raise UsageError(f"{source}: includes_draft must be true or false")
    return MeasuredCost.from_samples(
        verify,
        draft,
        [int(s) for s in sizes],
        label=f"measured ({p.name})",
        source=source,
        includes_draft=includes_draft,
    )
