"""The one verdict: may adaptive verification serve this plan on this host, and does it pay there?

Two halves, each read from this host's evidence below this layer, and composed only here:
  proof   probe records (probe.gate.gate_verdict): PROVEN, REFUTED (the newest matching record has a counting
          level that failed) or NOT_PROVEN (none, none trusted, none matching, none complete)
  payoff  A/B records, this host's calibration, the public prediction (probe.payoff.payoff_verdict): pays, loses
          or unknown at the declared concurrency; read only once the proof holds (or `ahead`), so the common
          no-record `recipe` costs nothing more
The answer is one Verdict whose state (recipe.plan.State) is PROVEN, REFUTED, NOT_PROVEN or NOT_PAYING. `recipe`,
`launch`, `up` (its choose, in-image probe and prove steps), `probe` and `validate` ask `judge`; none composes
the halves or reads a state from which fields a Verdict carries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from rocm_dspark.recipe.plan import NOT_PROVEN, PROVEN, REFUTED, State, Verdict

if TYPE_CHECKING:
    from rocm_dspark.probe.payoff import Payoff


class Judgement(NamedTuple):
    verdict: Verdict             # the answer: serve adaptive verification only when its state is PROVEN
    proof: Verdict               # the proof half alone (PROVEN | REFUTED | NOT_PROVEN)
    payoff: Payoff | None        # the payoff half, when it was read
    warning: str | None = None   # --adaptive on: proven, but it loses for this workload

    @property
    def state(self) -> State:
        return self.verdict.outcome


def combine(proof: Verdict, payoff: Payoff | None, mode: str) -> tuple[Verdict, str | None]:
    """Both halves -> (Verdict, warning or None).

    auto: on only with the proof AND a payoff that pays; the reason says which evidence decided.
    on:   the proof alone; a warning when the payoff says it loses."""
    from rocm_dspark.probe.payoff import LOSES, PAYS

    if proof.outcome != PROVEN or payoff is None:
        return proof, None
    decided = f"payoff decided by {payoff.evidence}: {payoff.text}"
    if mode == "on":
        warning = (f"--adaptive on: adaptive verification is proven here but does not pay for this workload "
                   f"({payoff.text}); block verification would serve more tokens/s" if payoff.state == LOSES else None)
        return Verdict(True, f"{proof.reason}; {decided}", proof.record, PROVEN), warning
    if payoff.state == PAYS:
        return Verdict(True, f"{proof.reason}; {decided}", proof.record, PROVEN), None
    why = "it loses" if payoff.state == LOSES else "it is not shown to pay"
    return Verdict.not_paying(f"proven on this host ({proof.reason}), but {why} for the declared workload, so block "
                              f"verification stays ({decided})", proof.record), None


def judge(catalog, plan, *, state_dir=None, concurrency: int | None = None, mode: str = "auto",
          soft: dict | None = None, ahead: bool = False) -> Judgement:
    """The verdict for this host, plan and workload from the trusted records in the state directory.
    `soft`: the software the plan runs on when not this Python's (an image's, probe.software). `ahead`: read the
    payoff even before a proof (up's prove step: is an adaptive start worth one load?), never after a refutation."""
    from rocm_dspark.probe.gate import gate_verdict

    proof = gate_verdict(catalog, plan, state_dir=state_dir, soft=soft)
    payoff = None
    if proof.outcome == PROVEN or (ahead and proof.outcome != REFUTED):
        from rocm_dspark.probe.payoff import payoff_verdict

        payoff = payoff_verdict(catalog, plan, concurrency, state_dir, soft=soft)
    verdict, warning = combine(proof, payoff, mode)
    return Judgement(verdict, proof, payoff, warning)


def local_verdict(level, ab_verdict: dict) -> Verdict:
    """up's local-cpu target: the gate's rules for a live level (probe.gate.level_proves) without the ones no CPU
    run can meet (the plan's own command with enable_adaptive_verification), and the A/B just measured for the
    payoff. Its records never count for the gate; this only decides which stand-in `up` keeps serving."""
    ev = level.evidence or {}
    if not level.passed:
        return Verdict.refuted(f"its live level failed: {level.reason}", None)
    if not (ev.get("serving_process") or {}).get("verified") or not ev.get("command_verified"):
        return Verdict(False, "its live level attached to a server not shown to run the adaptive stand-in", None,
                       NOT_PROVEN)
    if ev.get("token_correct") is not True:
        return Verdict(False, "its live level did not prove the emitted tokens by re-scoring", None, NOT_PROVEN)
    why = "live level passed on the adaptive stand-in (tokens re-scored, the serving process checked in /proc)"
    if not ab_verdict.get("pays"):
        return Verdict.not_paying(f"proven ({why}), but it does not pay: {ab_verdict.get('text')}", None)
    return Verdict(True, f"proven ({why}) and paying ({ab_verdict.get('text')}); local-cpu: not valid for gating",
                   None, PROVEN)


__all__ = ["Judgement", "combine", "judge", "local_verdict"]
