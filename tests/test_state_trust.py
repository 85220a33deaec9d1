"""Trust of state files beyond probe/ (issue 22, campaign classes "Trust of ab/" and "up-state.json is trusted
as it is found"): the A/B record directory and the fingerprint's host."""

from __future__ import annotations

import os

import pytest

from rocm_dspark.probe import fingerprint, payoff
from tests.test_gate_payoff import decide, fp, write_ab  # noqa: F401 (fp is a fixture)


def test_a_signed_ab_record_in_a_world_writable_ab_dir_does_not_count(tmp_path, fp):  # noqa: F811
    tmp_path.chmod(0o700)
    write_ab(tmp_path, fp, block=1000, adaptive=1100)
    assert decide(tmp_path, fp).state == payoff.PAYS
    (tmp_path / "ab").chmod(0o777)
    d = decide(tmp_path, fp)
    assert d.state != payoff.PAYS and d.evidence == "prediction"
    assert "are not trusted" in d.text and "mode 0777" in d.text and "chmod go-w" in d.text


def test_a_symlinked_ab_dir_is_ignored_with_a_note_not_an_error(tmp_path, fp):  # noqa: F811
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    write_ab(real, fp, block=1000, adaptive=1100)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "ab").symlink_to(real / "ab")
    d = decide(state, fp)  # was: UsageError "cannot read the probe record directory ... symlink"
    assert d.evidence == "prediction" and "is a symlink" in d.text


def test_recipe_concurrency_with_a_symlinked_ab_dir_still_prints_a_plan(tmp_path, monkeypatch):
    """The payoff half is read once the proof holds; the proof is stubbed as held (a real one needs an MI300)."""
    from click.testing import CliRunner

    from rocm_dspark.probe import gate
    from tests.test_gate_payoff import PROVEN

    monkeypatch.setattr(gate, "gate_verdict", lambda *a, **k: PROVEN)

    from rocm_dspark.cli import cli
    from rocm_dspark.probe import store

    state = tmp_path / "state"
    (tmp_path / "other" / "ab").mkdir(parents=True, mode=0o700)
    (tmp_path / "other" / "ab" / "20261201T011000Z-0000abcd.json").write_text("{}")
    state.mkdir(mode=0o700)
    store.ensure_key(state)
    (state / "ab").symlink_to(tmp_path / "other" / "ab")
    res = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--concurrency", "64",
                                   "--state-dir", str(state)])
    assert res.exit_code == 0, res.output
    assert "vllm serve" in res.output and "is a symlink" in res.output


def test_the_fingerprint_names_the_host(monkeypatch, tmp_path):
    ident = tmp_path / "machine-id"
    ident.write_text("0123456789abcdef0123456789abcdef\n")
    monkeypatch.setattr(fingerprint, "MACHINE_ID_FILES", (ident,))
    here = fingerprint.host_id()
    assert here.startswith("machine-") and "0123456789abcdef" not in here  # a hash, not the id itself
    ident.write_text("fedcba9876543210fedcba9876543210\n")
    assert fingerprint.host_id() != here
    monkeypatch.setattr(fingerprint, "MACHINE_ID_FILES", (tmp_path / "none",))
    assert fingerprint.host_id() == "hostname-" + os.uname().nodename
    assert fingerprint.host_fingerprint(gpus={"gpu_arch": None, "gpu_name": None, "gpu_count": 0})["host_id"]


def test_a_record_from_another_host_sharing_the_state_dir_does_not_count(tmp_path, fp):  # noqa: F811
    """NFS/PVC: one state dir (one host.key) seen by two hosts; host B's A/B record must not decide on host A."""
    write_ab(tmp_path, dict(fp, host_id="machine-otherhost0000000"), block=1000, adaptive=1100)
    d = decide(tmp_path, fp)
    assert d.evidence == "prediction" and "host machine-otherhost0000000" in d.text


@pytest.mark.parametrize("sub", ["probe", "ab"])
def test_both_record_dirs_follow_the_same_directory_rules(tmp_path, sub):
    from rocm_dspark.probe import store

    tmp_path.chmod(0o700)
    (tmp_path / sub).mkdir(mode=0o777)
    (tmp_path / sub).chmod(0o777)
    assert "mode 0777" in store.untrusted_reason(tmp_path, sub)
    with pytest.raises(Exception, match="would not be trusted"):
        store.prepare_dir(tmp_path / sub)
