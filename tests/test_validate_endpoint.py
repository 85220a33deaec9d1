"""validate --endpoint: a value urllib cannot split (an unclosed IPv6 bracket) is one line, exit 2, no traceback
(found by tests/test_cli_fuzz.py: `--endpoint '['` raised ValueError "Invalid IPv6 URL")."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.errors import UsageError
from rocm_dspark.validate.context import parse_endpoint


@pytest.mark.parametrize("url", ["[", "http://[::1", "[::1:8000"])
def test_an_unclosed_ipv6_bracket_is_a_usage_error(url):
    with pytest.raises(UsageError, match="give the server's base URL"):
        parse_endpoint(url)


def test_the_cli_says_it_in_one_line(tmp_path):
    r = CliRunner().invoke(cli, ["validate", "--model", "V4.1-Flash", "--endpoint", "[", "--report", str(tmp_path / "r")])
    assert r.exit_code == 2 and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "r").exists()
    assert parse_endpoint("http://[::1]:8000") == ("::1", 8000)
