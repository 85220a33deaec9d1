"""Issue 32: the readiness checks to run inside an existing real `up` run (no vLLM start of their own).

The slow suite is at its CI budget, so these are called from the run of tests/slow/test_up_loads_real.py that
proves adaptive verification (pass `ready_args(port)` to its `up`):

    rport = free_port(); up = _up_args(...) + ready_args(rport)
    ... at the point it sees phase "proving" with two vLLM execs:  proving = while_proving(cli, state_dir, rport)
    ... once `up` has exited 0 (out: its output):                    after_up(cli, state_dir, rport, out)
    ... after `down`:                                                after_down(rport)

Each asserts that GET /ready on the readiness server `up --ready-port` started (a real process, asked by a real
HTTP client on loopback) and `rocm-dspark status --ready` give the same answer, while the real vLLM's own
/health already says 200.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request


def ready_args(port: int) -> list[str]:
    return ["--ready-port", str(port)]


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _both(cli, state_dir, rport: int) -> tuple[int, dict, int, dict]:
    code, body = _get(f"http://127.0.0.1:{rport}/ready")
    r = subprocess.run([*cli, "status", "--ready", "--json", "--state-dir", str(state_dir)], capture_output=True,
                       text=True, timeout=120)
    return code, body, r.returncode, json.loads(r.stdout)


def while_proving(cli, state_dir, rport: int) -> dict:
    """While the adaptive start is proved: 503 "proving" on /ready, status --ready exits 1 with the same phase,
    although the served vLLM answers its own /health with 200 once the adaptive start has loaded."""
    code, body, rc, cli_body = _both(cli, state_dir, rport)
    assert code == 503 and body["ready"] is False and body["phase"] == "proving", body
    assert rc == 1 and cli_body["phase"] == "proving" and cli_body["why"] == body["why"], cli_body
    return body


def after_up(cli, state_dir, rport: int, up_output: str | None = None) -> dict:
    """`up` exited 0: the served command is final and validated: 200 "serving", status --ready exits 0; its
    summary (`up_output`, when given) names the readiness URL."""
    if up_output is not None:
        assert f"readiness GET http://127.0.0.1:{rport}/ready (200 when validated" in " ".join(up_output.split())
    code, body, rc, cli_body = _both(cli, state_dir, rport)
    assert code == 200 and body["ready"] is True and body["phase"] == "serving", body
    assert "validated" in body["why"] and rc == 0 and cli_body == body, (body, cli_body)
    return body


def after_down(rport: int) -> None:
    """`down` stopped the readiness server with the service: nothing answers on its port."""
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{rport}/ready", timeout=5)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"the readiness server still answers after down: {exc.code}") from None
    except OSError:
        return
    raise AssertionError("the readiness server still answers after down")
