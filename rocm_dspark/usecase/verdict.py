"""The one verdict: may adaptive verification serve this plan here, and does it pay? The proof (probe records,
probe.gate) and the payoff (A/B records, calibration, prediction: probe.payoff) are composed only here, into one
Verdict whose state (recipe.plan.State, docs/trust.md "One verdict") every command reads; none composes the halves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from rocm_dspark.recipe.plan import PROVEN, REFUTED, Verdict

if TYPE_CHECKING:
    from rocm_dspark.probe.payoff import Payoff


class Judgement(NamedTuple):
    verdict: Verdict  # the answer: adaptive verification serves only when its state is PROVEN
    proof: Verdict  # the proof half alone (PROVEN | REFUTED | NOT_PROVEN)
    payoff: Payoff | None  # the payoff half, when read
    warning: str | None  # --adaptive on: proven, but it loses for this workload


def combine(proof: Verdict, payoff: Payoff | None, mode: str) -> tuple[Verdict, str | None]:
    """auto: on only with the proof AND a payoff that pays; on: the proof alone, warned when the payoff loses."""
    if proof.outcome != PROVEN or payoff is None:
        return proof, None
    from rocm_dspark.probe.payoff import LOSES, PAYS

    decided = f"payoff decided by {payoff.evidence}: {payoff.text}"
    if mode == "on" or payoff.state == PAYS:
        warning = None
        if mode == "on" and payoff.state == LOSES:
            warning = (
                f"--adaptive on: adaptive verification is proven here but does not pay for this workload "
                f"({payoff.text}); block verification would serve more tokens/s"
            )
        return Verdict(True, f"{proof.reason}; {decided}", proof.record, PROVEN), warning
    why = "it loses" if payoff.state == LOSES else "it is not shown to pay"
    return Verdict.not_paying(
        f"proven on this host ({proof.reason}), but {why} for the declared workload, so block "
        f"verification stays ({decided})",
        proof.record,
    ), None


def judge(
    catalog,
    plan,
    *,
    state_dir=None,
    concurrency: int | None = None,
    mode: str = "auto",
    soft: dict | None = None,
    ahead: bool = False,
) -> Judgement:
    """`soft`: the plan's software when not this Python's (an image's). The payoff is read once proven (the common
    no-record `recipe` costs nothing more), or `ahead` of a proof (is an adaptive start worth a load?)."""
    from rocm_dspark.probe.gate import gate_verdict

    proof = gate_verdict(catalog, plan, state_dir=state_dir, soft=soft)
    payoff = None
    if proof.outcome == PROVEN or (ahead and proof.outcome != REFUTED):
        from rocm_dspark.probe.payoff import payoff_verdict

        payoff = payoff_verdict(catalog, plan, concurrency, state_dir, soft=soft)
    verdict, warning = combine(proof, payoff, mode)
    return Judgement(verdict, proof, payoff, warning)


def local_verdict(level, ab_verdict: dict) -> Verdict:
    """up's local-cpu target (its records never count for the gate): the gate's live-level rules that a CPU run can
    meet, and the A/B just measured."""
    ev = level.evidence or {}
    if not level.passed:
        return Verdict.refuted(f"its live level failed: {level.reason}", None)
    if not (ev.get("serving_process") or {}).get("verified") or not ev.get("command_verified"):
        return Verdict.not_proven("its live level attached to a server not shown to run the adaptive stand-in")
    if ev.get("token_correct") is not True:
        return Verdict.not_proven("its live level did not prove the emitted tokens by re-scoring")
    why = "live level passed on the adaptive stand-in (tokens re-scored, the serving process checked in /proc)"
    if not ab_verdict.get("pays"):
        return Verdict.not_paying(f"proven ({why}), but it does not pay: {ab_verdict.get('text')}", None)
    return Verdict(
        True, f"proven ({why}) and paying ({ab_verdict.get('text')}); local-cpu: not valid for gating", None, PROVEN
    )
