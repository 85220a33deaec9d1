"""The CLI fuzz campaign (issue #14, item 5): random command lines over every command and option, run in process
with click's CliRunner, each classified as fine or as a finding.

Used by tests/test_cli_fuzz.py (10^3 examples in the fast suite) and benchmarks/cli_fuzz.py (10^5, with counts).

Real: option parsing, selection, resolve, gate, launch files, plan (simulator and plot), server-json and
cost-table loading, probe --show, status. Stubbed, because each would run for minutes or start or stop servers:
the body of a probe run (`run_probe`), of `validate` (`run_validation`), `plugin status` (`plugin_status`),
`up` (`run_up`), `down`, `status --ready --listen`'s server (`serve_forever`), and `images`' registry questions (`report.run`, network); everything up to those calls
runs for real, and reaching one counts as a clean exit. The planner's simulator (seeded, so a pure function of its
arguments) runs for real once per distinct input and is answered from a memo after that (`plan` with the same
model and GPUs is most of the campaign's command lines, 2 s each on this 2-core machine).

Safety: every run happens in a fresh temp directory (the runner's cwd); every option that names something to
write or read (--output, --plot, --report, --state-dir, --env-file, ...) gets a relative name or a fixture
inside that directory, never an absolute path or `..`, so nothing outside it can be written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from pathlib import Path
from typing import NamedTuple

import click
from hypothesis import strategies as st

from rocm_dspark.cli import COMMANDS, cli

PATH_OPTIONS = {"output", "plot", "report_dir", "state_dir", "env_file", "cost_table", "server_json", "python",
                "model_path"}
HOSTILE = [
    "", " ", "-", "--", "=", "==", ".", "..", "\\", "a\\", "'", '"', "`id`", "$(id)", "${HOME}", "$HOME", "%n", "%%",
    "\n", "a\nb", "\r", "\t", "\x1b[31m", "\x7f", "\u00e9", "\u202e", "\U0001f600", "a b", "-1", "0", "-0", "1e309",
    "nan", "inf", "-inf", "999999999999999999999", "0x10", "1,2", ",", ",,", "1,,2", " 1 ", "true", "null", "{}",
    "[]", '{"a":1}', "x" * 300, "\udcff", "a\udcffb", "--speculative-config={}", "--enforce-eager=--x",
    "--speculative_config.enable_adaptive_verification=true", "-sc", "--port=1", "mi300x", "V4.1-Flash",
    "0.32.0", "0.33.0", "latest", "nightly", "~", "~nosuchuser/x", "*", "?", "[a]", "#", ";", "&", "|", "<", ">",
]
# A real command line cannot carry a NUL byte (argv is C strings), so the generator never makes one.
ARGV_CHARS = st.characters(blacklist_characters="\x00")
SAFE_NAMES = ["out", "d", "f.json", "fifo.json", "link.json", "bin.dat", "u16.json", "deep.json", "bigint.json",
              "plot.png", "new/x", "d/x.png", "state", "a b", "x\\", "%n", "\u00e9", "x" * 300, ".", "missing",
              "d/", "-d", "e.env", "loose.env"]


def fixtures(root: Path) -> None:
    """The files the safe names point at, inside `root`."""
    (root / "d").mkdir()
    (root / "out").mkdir()
    (root / "state").mkdir(mode=0o700)
    (root / "f.json").write_text('{"verify": [[1, 2.0], [64, 3.0]]}')
    os.mkfifo(root / "fifo.json")
    os.symlink("f.json", root / "link.json")
    (root / "bin.dat").write_bytes(b"\x00\x01\xff\xfe")
    (root / "u16.json").write_bytes('{"verify": [[1, 2]]}'.encode("utf-16"))
    (root / "deep.json").write_text("[" * 100000)
    (root / "bigint.json").write_text('{"verify": [[' + "9" * 5000 + ", 1]]}")
    (root / "e.env").write_text("")
    (root / "e.env").chmod(0o600)
    (root / "loose.env").write_text("")
    (root / "loose.env").chmod(0o644)


def _commands() -> dict[str, click.Command]:
    out = {}
    ctx = click.Context(cli)
    for name in sorted(COMMANDS):
        cmd = cli.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(ctx):
                out[f"{name} {sub}"] = cmd.get_command(ctx, sub)
        else:
            out[name] = cmd
    return out


COMMAND_TABLE = _commands()


def _values(opt: click.Option):
    if opt.name in PATH_OPTIONS:
        return st.sampled_from(SAFE_NAMES)
    kinds = [st.sampled_from(HOSTILE), st.text(ARGV_CHARS, max_size=12)]
    t = opt.type
    if isinstance(t, click.Choice):
        kinds += [st.sampled_from(list(t.choices))] * 3
    elif isinstance(t, (click.types.IntParamType, click.IntRange)) or t is click.INT:
        kinds += [st.integers(-(2**70), 2**70).map(str), st.integers(-3, 600).map(str)] * 2
    elif isinstance(t, (click.types.FloatParamType, click.FloatRange)) or t is click.FLOAT:
        kinds += [st.floats(allow_nan=True, allow_infinity=True).map(repr), st.floats(0, 10).map(str)] * 2
    if opt.name == "extra_args":
        flag = st.sampled_from(["--max-model-len", "--enforce-eager", "--speculative-config", "--x", "-tp", "--port",
                                "--max_num_seqs", "--compilation-config", "-cc", "--config", "--spec", "-O"])
        kinds += [st.builds(lambda f, s, v: f + s + v, flag, st.sampled_from(["", "="]), st.sampled_from(HOSTILE))] * 3
    if opt.name == "extra_env":
        kinds += [st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["A", "HF_TOKEN", "1X", "", "A B"]),
                            st.sampled_from(HOSTILE))] * 3
    if opt.name in ("gpu", "concurrency", "acceptance_rates", "levels", "num_speculative_tokens"):
        kinds += [st.sampled_from(["mi300x", "mi355x,mi300x", "1,16", "0.9,0.8", "static,kernel", "static", "5",
                                   "3", "1,2,3"])] * 3
    return st.one_of(kinds)


@st.composite
def invocations(draw) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMAND_TABLE)))
    cmd = COMMAND_TABLE[name]
    options = [p for p in cmd.params if isinstance(p, click.Option)]
    argv = name.split()
    names = {p.name for p in options}
    if "model" in names and draw(st.integers(0, 9)) < 7:
        argv += ["--model", draw(st.sampled_from(["V4.1-Flash", "V4-Flash", "v4.1", "nope"]))]
    if "gpu" in names and draw(st.booleans()):
        argv += ["--gpu", draw(st.sampled_from(["mi300x", "mi355x", "mi325x"]))]
    if "state_dir" in names:
        argv += ["--state-dir", "state"]
    if "report_dir" in names:
        argv += ["--report", "out"]
    for opt in draw(st.lists(st.sampled_from(options), max_size=6)) if options else []:
        spelled = draw(st.sampled_from(list(opt.opts) + list(opt.secondary_opts)))
        if opt.is_flag or opt.count:
            argv.append(spelled)
        else:
            argv += [spelled, draw(_values(opt))]
    if draw(st.integers(0, 19)) == 0:
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(HOSTILE)))
    return argv


class Outcome(NamedTuple):
    argv: list[str]
    exit_code: int | None
    finding: str | None  # None: fine


class _Reached(Exception):
    """A stubbed runner was reached: everything before it ran for real."""


class _Hang(Exception):
    pass


_SIMULATED: dict[bytes, object] = {}  # kept across runs: stubs() is entered once per command line


@contextlib.contextmanager
def memo_simulate():
    """planner.simulator.simulate, memoised on the pickled arguments (the cost, rates, batch, policy, dp, steps and
    seed it is a deterministic function of; a pickle taken at the call, so a cost changed later is another key)."""
    import pickle

    import rocm_dspark.planner.recommend as recommend
    import rocm_dspark.planner.simulator as simulator

    real = simulator.simulate

    def simulate(*args, **kwargs):
        try:
            key = pickle.dumps((args, sorted(kwargs.items())))
        except (pickle.PicklingError, TypeError, AttributeError):  # an argument pickle cannot take: no memo
            return real(*args, **kwargs)
        if key not in _SIMULATED:
            _SIMULATED[key] = real(*args, **kwargs)
        return _SIMULATED[key]

    assert recommend.simulate is real
    simulator.simulate = recommend.simulate = simulate
    try:
        yield
    finally:
        simulator.simulate = recommend.simulate = real


@contextlib.contextmanager
def stubs():
    import rocm_dspark.images.report as images_report
    import rocm_dspark.probe.run as run
    import rocm_dspark.service.readiness as up_health
    import rocm_dspark.service.status as svc_status
    import rocm_dspark.up.runner as up_runner
    import rocm_dspark.validate as validate
    import rocm_dspark.vllm_plugin.status as status

    def reached(*a, **k):
        raise _Reached()

    saved = [(run, "run_probe", run.run_probe), (validate, "run_validation", validate.run_validation),
             (status, "plugin_status", status.plugin_status),
             (up_runner, "run_up", up_runner.run_up), (svc_status, "down", svc_status.down),
             (up_health, "serve_forever", up_health.serve_forever),
             (images_report, "run", images_report.run)]
    for mod, attr, _ in saved:
        setattr(mod, attr, reached)
    try:
        with memo_simulate():
            yield
    finally:
        for mod, attr, value in saved:
            setattr(mod, attr, value)


def run_one(runner, argv: list[str], time_limit_s: int = 30) -> Outcome:
    """Run argv in a fresh temp dir with fixtures; classify the result."""
    with tempfile.TemporaryDirectory(prefix="rocm-dspark-fuzz-") as tmp:
        root = Path(tmp)
        fixtures(root)
        old = os.getcwd()
        os.chdir(root)

        def on_alarm(*_):
            raise _Hang()

        prev = signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(time_limit_s)
        try:
            env = {"ROCM_DSPARK_STATE_DIR": str(root / "state"), "XDG_STATE_HOME": str(root / "xdg"), "HOME": str(root)}
            result = runner.invoke(cli, argv, env=env, catch_exceptions=True)
        except _Hang:
            return Outcome(argv, None, f"no exit within {time_limit_s} s")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, prev)
            os.chdir(old)
    exc = result.exception
    if isinstance(exc, _Reached):
        return Outcome(argv, 0, None)
    if isinstance(exc, _Hang):
        return Outcome(argv, None, f"no exit within {time_limit_s} s")
    if exc is not None and not isinstance(exc, SystemExit):
        import traceback

        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
        return Outcome(argv, None, f"{type(exc).__name__} at {where}: {str(exc)[:160]}")
    out = result.output
    if "Traceback" in out:
        return Outcome(argv, result.exit_code, "a traceback was printed")
    if result.exit_code not in (0, 1, 2):
        return Outcome(argv, result.exit_code, f"exit status {result.exit_code}")
    if result.exit_code == 2:
        err = (result.stderr if hasattr(result, "stderr") else out).strip().splitlines()
        if len(err) != 1 and not any(line.startswith("Usage:") for line in err):
            return Outcome(argv, 2, f"exit 2 with {len(err)} lines on stderr")
    return Outcome(argv, result.exit_code, None)


def make_runner():
    from click.testing import CliRunner

    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 keeps stderr apart by default
        return CliRunner()
