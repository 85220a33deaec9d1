"""One verdict (rocm_dspark/usecase/verdict.py): for every combination of evidence, every caller reaches the same
decision. Before, three places composed the proof and the payoff, and the in-image probe rebuilt "refuted" from
whether the gate named a record, while the prove step read the probe step's own state string.

The records are built and signed by the real code (tests/helpers/probe_records.py, ab_records.py) for the MI300X
host that the fixture mi300x_host stands in for (no AMD GPU here). The public prediction is pinned to "cannot tell"
so that only the records decide the payoff. The probe CLI's levels are a stand-in that writes what this CPU host
writes (a record whose level does not count): the levels themselves are tests/test_probe*.py's.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.probe import payoff
from rocm_dspark.recipe.catalog import load_catalog
from rocm_dspark.recipe.plan import NOT_PAYING, NOT_PROVEN, PROVEN, REFUTED
from rocm_dspark.recipe.resolve import resolve_plan
from tests.helpers import ab_records
from tests.helpers import probe_records as pr

SEL = {"model": "V4.1-Flash", "gpu": "mi300x", "vllm_version": "0.32.0"}
C = 64
PROBES = {"none": None, "failed": (pr.STATIC_OK, pr.KERNEL_OK, pr.LIVE_REFUSED),
          "passed": (pr.STATIC_OK, pr.KERNEL_OK, pr.LIVE_OK)}
ABS = ("none", "loses", "pays", "stale", "untrusted")


def expected(probe: str, ab: str):
    if probe == "none":
        return NOT_PROVEN
    if probe == "failed":
        return REFUTED
    return PROVEN if ab == "pays" else NOT_PAYING  # a stale or untrusted A/B decides nothing: the prediction can't tell


def plant(state, probe: str, ab: str) -> None:
    catalog = load_catalog()
    fp = pr.here(catalog)
    if PROBES[probe]:
        pr.write(state, fp, PROBES[probe])
    if ab == "none":
        return
    gain = {"loses": 900.0}.get(ab, 1100.0)
    ab_records.write_ab(state, {**fp, "host_id": "machine-0123456789abcdef"} if ab == "stale" else fp,
                        block=1000.0, adaptive=gain, concurrency=C, rid="20261201T010000Z-0000bbbb")
    if ab == "untrusted":
        (state / "ab").chmod(0o777)


def via_launch_plan(state, tmp_path, monkeypatch, ab):
    from rocm_dspark.usecase.launch_plan import plan_for, verdict_for

    opts = {**SEL, "state_dir": str(state), "concurrency": C}
    catalog = load_catalog()
    state_ = verdict_for(opts, catalog, resolve_plan(catalog, plan_for({**opts, "adaptive": "off"})[1])).outcome
    assert plan_for(opts)[2].adaptive_verification == (state_ == PROVEN)
    return state_


def _up(state, mode="foreground"):
    from rocm_dspark.up.runner import UpOptions, UpRun
    from rocm_dspark.service.state import UpState, up_dir

    class Display:
        def say(self, line):
            pass

    opts = UpOptions(selection={**SEL, "state_dir": str(state)}, mode=mode, yes=True, concurrency=(C,))
    return UpRun(opts, Display(), UpState.load(up_dir(opts.state_dir)))


def via_prove_step(state, tmp_path, monkeypatch, ab):
    from rocm_dspark.up import prove

    run = _up(state)
    got = run.target.decide(run, None, {}).outcome  # after the adaptive start: keep it?
    why = prove.skip(run)                         # before it: is an adaptive start worth one load?
    if got == PROVEN:
        assert why.startswith("skipped: the gate already chose adaptive verification"), why
    elif got == REFUTED:
        assert "refute adaptive verification here" in why, why
    else:  # the payoff read ahead: only an A/B that loses saves the load
        assert (why is not None and "does not pay" in why) == (ab == "loses"), why
    return got


def via_in_image_probe(state, tmp_path, monkeypatch, ab):
    from rocm_dspark.images import pull as image_mod
    from rocm_dspark.images import wheel
    from rocm_dspark.up import steps

    tool = tmp_path / "docker"  # the image's probe: it runs and writes nothing (the records are planted)
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    monkeypatch.setattr(image_mod, "runtime", lambda: str(tool))
    monkeypatch.setattr(wheel, "build_wheel", lambda out: out / "rocm_dspark-0.1.0-py3-none-any.whl")
    run = _up(state, "container")
    from rocm_dspark.up import choice

    monkeypatch.setattr(choice, "gate_software", lambda run: None)  # the image's software is this Python's here
    run.outputs["image"] = {"pinned": run.plan.image}
    out = steps.probe_in_image(run)
    skip = steps.in_image_skip(run)
    assert (skip is not None) == (out["gate"] in (PROVEN, NOT_PAYING)), (skip, out)  # a proof: no second probe
    return out["gate"]


def via_probe_cli(state, tmp_path, monkeypatch, ab):
    import rocm_dspark.probe.run as probe_run
    from rocm_dspark.probe.gate import evidence_state
    from rocm_dspark.probe.record import parse_record_data

    def cpu_levels(catalog, selection, **kw):
        cpu = pr.STATIC_OK._replace(valid_for_gating=False, gating_note="not valid for gating: no AMD GPU detected")
        _, path = pr.write(state, pr.here(catalog), (cpu,), record_id="20261129T110000Z-0000cccc")
        data = json.loads(open(path).read())
        record = parse_record_data(data)
        return probe_run.ProbeOutcome(path, record, True, *evidence_state(record))

    monkeypatch.setattr(probe_run, "run_probe", cpu_levels)
    got = CliRunner().invoke(cli, ["probe", *sum((["--" + k.replace("_", "-"), v] for k, v in SEL.items()), []),
                                   "--concurrency", str(C), "--levels", "static", "--state-dir", str(state), "--json"])
    assert got.exit_code == 0, got.output
    return json.loads(got.stdout)["verdict"]["state"]


def via_validate(state, tmp_path, monkeypatch, ab):
    from rocm_dspark.usecase.launch_plan import plan_for
    from rocm_dspark.validate import software_checks
    from rocm_dspark.validate.context import Context, ValidateOptions

    catalog, _, plan = plan_for({**SEL, "state_dir": str(state), "concurrency": C})
    ctx = Context(ValidateOptions(report_dir=tmp_path / "report"), catalog, catalog.find_model(plan.model_key), plan,
                  data={"state_dir": str(state)})
    return software_checks.probe(ctx).value["state"]


CALLERS = [via_launch_plan, via_prove_step, via_in_image_probe, via_probe_cli, via_validate]


@pytest.mark.parametrize("ab", ABS)
@pytest.mark.parametrize("probe", list(PROBES))
def test_every_caller_reaches_the_same_verdict(mi300x_host, tmp_path, monkeypatch, probe, ab):
    monkeypatch.setattr(payoff, "predicted", lambda *a, **k: payoff.Payoff(payoff.UNKNOWN, "prediction", "pinned"))
    plant(mi300x_host, probe, ab)
    got = {caller.__name__: caller(mi300x_host, tmp_path, monkeypatch, ab) for caller in CALLERS}
    assert got == {caller.__name__: expected(probe, ab) for caller in CALLERS}
