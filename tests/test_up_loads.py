"""Issue 32: `up` in as few model loads as the evidence needs (fast part; the real vLLM run is
tests/slow/test_up_loads_real.py).

- --dry-run prints the commands the run executes: the start step's and the prove step's lines are compared with
  what the real steps run through the privileged runner (runtime.actions.execute) and the launcher start
  (service.start_process), both recorded here, for each mode. Nothing starts: the recorded runner answers 0, and
  readiness is answered by the display stand-in.
- The prove step's A/B decision goes through the real gate, this host's calibration included
  (probe/payoff.payoff_verdict): a host fit that says "pays" is not skipped as "does not pay".
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.runtime import actions
from rocm_dspark.service import control as service
from rocm_dspark.service import start
from rocm_dspark.up import prove, serve, steps
from rocm_dspark.runtime.actions import argv_of
from rocm_dspark.up.runner import UpOptions, UpRun
from rocm_dspark.service.state import UpState, up_dir


class Display:
    """Answers every readiness wait at once (the recorded runner started nothing that could become ready)."""

    def __init__(self):
        self.lines = []

    def say(self, line):
        self.lines.append(line)

    def wait(self, label, log, poll, poll_s=1.0, deadline_s=None):
        got = poll()  # a launcher start: the fake server is ready; a unit: not yet active, so "ready" here
        return (got if got is not None else "ready"), None, 0.0


class FakeServer:
    def __init__(self, base_url):
        self.base_url = base_url

    def ready_check(self, gate=None):
        from types import SimpleNamespace

        def look():  # ready at once, once the launcher's gate holds
            return SimpleNamespace(ready=True, status="ready", elapsed_s=0.0) if gate is None or gate() is None else None

        look.timed_out = lambda: SimpleNamespace(ready=False, status="timeout", elapsed_s=0.0,
                                                 reason=lambda: "not ready after 0.0 s")
        return look


def _run(tmp_path, mode, **kw) -> UpRun:
    opts = UpOptions(selection={"model": "V4.1-Flash", "gpu": "mi300x", "state_dir": str(tmp_path / "state")},
                     mode=mode, yes=True, **kw)
    return UpRun(opts, Display(), UpState.load(up_dir(opts.state_dir)))




def flat(text: str) -> str:
    """The output with wrapped lines folded back (the wrapping itself is tests/test_operator_papercuts.py's)."""
    return " ".join(text.replace("#   ", "").replace("# ", "").split())


def _dry_section(out: str, step: int) -> list[str]:
    lines = out.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith(f"# [{step:2d}/10]"))
    body: list[str] = []
    for ln in lines[at + 1:]:
        if ln.startswith("# ["):
            break
        if not ln.strip().startswith("#"):  # the commands; the rest are comments
            body.append(ln.strip())
    return body


@pytest.mark.parametrize("mode", ["systemd", "foreground", "container"])
def test_dry_run_lists_exactly_the_commands_the_start_and_prove_steps_run(tmp_path, monkeypatch, mode):
    from rocm_dspark import textwidth

    monkeypatch.setattr(textwidth, "columns", lambda: 10**6)  # word for word: unwrapped (wrapping: test_operator_papercuts)
    monkeypatch.setattr(service, "systemd_usable", lambda: None)
    user = ["--service-user", "vllm"] if mode == "systemd" else []
    dry = CliRunner().invoke(cli, ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", mode, "--dry-run",
                                   "--concurrency", "64", "--state-dir", str(tmp_path / "state"), *user])
    assert dry.exit_code == 0, dry.output
    start_dry = _dry_section(dry.output, 7)
    prove_dry = _dry_section(dry.output, 8)

    # The real steps, with the privileged runner and the launcher start recorded.
    executed: list[str] = []
    monkeypatch.setattr(actions, "execute", lambda c, timeout=300.0: (executed.append(shlex.join(argv_of(c))), (0, ""))[1])

    def start_process(launcher, env, *, host, port, log_path):
        executed.append(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + f" {shlex.quote(str(launcher))} &")
        return FakeServer(f"http://127.0.0.1:{port}"), {"kind": "process", "pid": 4242, "host": host, "port": port,
                                                         "launcher": str(launcher), "base_url": f"http://127.0.0.1:{port}"}

    monkeypatch.setattr(service, "start_process", start_process)
    monkeypatch.setattr(service, "alive", lambda svc: False)
    monkeypatch.setattr(start, "launch_state", lambda d, wait_s=10.0: {})
    monkeypatch.setattr(start, "launcher_phase", lambda d: "serving")  # its warm-up passed
    run = _run(tmp_path, mode, concurrency=(64,), service_user="vllm" if mode == "systemd" else None)
    run.outputs["choose"] = steps.choose_run(run)
    run.outputs["launchers"] = steps.launchers_run(run)
    serve.load(run, serve.serving_command(run), "the service")
    assert executed == start_dry, (executed, start_dry)
    if mode == "systemd":  # issue 28: the dry run lists every privileged command, user and launcher included
        assert any("useradd --system" in c for c in start_dry) and any(c.startswith("install -D -m 0755")
                                                                       or "sudo install -D" in c for c in start_dry)
    executed.clear()
    serve.load(run, "adaptive", "prove")
    serve.load(run, "block", "back to block")
    assert executed == prove_dry, (executed, prove_dry)
    assert [ld["command"] for ld in run.loads] == ["block", "adaptive", "block"]
    assert [ld["n"] for ld in run.state.data["loads"]] == [1, 2, 3]


def test_dry_run_says_how_many_loads_with_and_without_concurrency(tmp_path):
    base = ["up", "--model", "V4.1-Flash", "--gpu", "mi300x", "--mode", "foreground", "--dry-run",
            "--state-dir", str(tmp_path)]
    with_c = CliRunner().invoke(cli, base + ["--concurrency", "1,64"])
    assert with_c.exit_code == 0, with_c.output
    assert ("model loads: 2 if adaptive verification is proven and pays at c=64 (block service, then one adaptive "
            "start that is kept), 3 if it is refuted or does not pay (back to block)") in flat(with_c.output)
    assert "without --concurrency: 1 (the gate cannot say it pays, so no adaptive start)" in flat(with_c.output)
    without = CliRunner().invoke(cli, base)
    assert "model loads: 1 (the service); the prove step makes no adaptive start" in flat(without.output)
    assert "with --concurrency C: 2 if it is proven and pays at C, 3 if refuted or not paying" in flat(without.output)
    assert "skipped: no workload declared: without --concurrency C the gate cannot say" in flat(without.output)


def _host_fit(tmp_path, state):
    from rocm_dspark.probe.calibration_record import run_calibrate
    from rocm_dspark.recipe.catalog import load_catalog
    from tests.helpers.host_fit_tables import synthetic_table

    catalog = load_catalog()
    run_calibrate(catalog, catalog.find_model("V4.1-Flash"), "mi300x", synthetic_table(tmp_path, "mi300x"), state)


def test_ab_decision_reads_the_host_calibration_before_the_public_prediction(tmp_path, monkeypatch):
    """Before: the decision read only the public prediction (payoff.predicted), so a public "loses" skipped the
    adaptive start although this host's fit (`plan --calibrate`, read first by the gate) says it pays."""
    from rocm_dspark.probe import payoff

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    public_loses = payoff.Payoff(payoff.LOSES, "prediction", "predicted -9.0 +- 1 points: loses (planted public file)")
    monkeypatch.setattr(payoff, "predicted", lambda *a, **k: public_loses)
    run = _run(tmp_path, "foreground", concurrency=(128,))
    why = prove.skip(run)
    assert why is not None and "does not pay at c=128" in why and "planted public file" in why  # no host fit yet
    _host_fit(tmp_path, state)
    run = _run(tmp_path, "foreground", concurrency=(128,))
    assert prove.skip(run) is None  # the host fit pays at 128: the adaptive start is made
    pay = payoff.payoff_verdict(run.catalog, run.plan, 128, state)
    assert pay.state == payoff.PAYS and "this host's calibration" in pay.evidence


def test_no_concurrency_makes_no_adaptive_start(tmp_path):
    # A refuting record: tests/test_verdict.py (the prove step asks the verdict, not the probe step's output).
    run = _run(tmp_path, "foreground")
    assert prove.skip(run).startswith("skipped: no workload declared")
    run = _run(tmp_path, "foreground", concurrency=(64,))
    run.options.selection["adaptive"] = "off"
    assert prove.skip(run).startswith("skipped: the plan has no adaptive command")


# status --ready / GET /ready while proving: tests/test_up_health.py (real servers on loopback)


def test_the_hand_written_start_texts_are_gone():
    text = Path(steps.__file__).read_text()
    assert not re.search(r"sudo systemctl (daemon-reload|enable)", text)  # the commands come from launch/launchers.py
