"""Unbounded sizes (issue 22 campaign): cost tables with 1e308 values or a 2 MB CSV field, IPv6 scope ids."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from rocm_dspark.cli import cli
from rocm_dspark.errors import UsageError
from rocm_dspark.recipe.strategies import check_address


@pytest.mark.parametrize("name,content,words", [
    ("ms.csv", "tokens,ms\n1,2\n64,1e308\n", "row 3 ms: 1e+308 is out of range"),
    ("tokens.csv", "tokens,ms\n1e308,2\n64,3\n", "row 2 tokens: 1e+308 is out of range"),
    ("v.json", '{"verify": [[1, 1e308], [64, 1e308]]}', "verify[0][1]: 1e+308 is out of range"),
    ("c.json", '{"verify": [[1, 2], [64, 3]], "capture_sizes": [1e308]}', "capture_sizes: 1e+308 is out of range"),
    ("i.json", '{"verify": [[1, 2], [' + "9" * 400 + ', 3]]}', "a 400-digit number is out of range"),
    ("field.csv", "tokens,ms\n1," + "x" * (2 << 20) + "\n", "not a CSV cost table (field larger than field limit"),
    ("quoted.csv", 'tokens,ms\n1,"' + "1" * 200000 + "\n", "not a CSV cost table"),
    ("long.csv", "tokens,ms\n1," + "1" * 100000 + "\n", "a 100000-character value is not a number"),
])
def test_a_hostile_cost_table_is_one_line(tmp_path, name, content, words):
    path = tmp_path / name
    path.write_text(content)
    r = CliRunner().invoke(cli, ["plan", "--model", "V4.1-Flash", "--gpu", "mi300x", "--cost-table", str(path)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1 and words in r.output, r.output


@pytest.mark.parametrize("address", ["fe80::1%eth0$(id)", "fe80::1%a b", "fe80::1%eth0;x", "fe80::1%" + "e" * 16,
                                     "fe80::1%eth0:1", "fe80::1%\n"])
def test_an_ipv6_scope_id_must_name_an_interface(address):
    with pytest.raises(UsageError, match="scope id"):
        check_address(address)


@pytest.mark.parametrize("address", ["fe80::1%eth0", "fe80::1%2", "fe80::1%enp1s0f0.100", "10.0.0.1", "::1"])
def test_a_real_address_still_passes(address):
    assert check_address(address) == address


def test_recipe_refuses_a_hostile_scope_id_in_one_line():
    r = CliRunner().invoke(cli, ["recipe", "--model", "V4.1-Flash", "--gpu", "mi300x", "--strategy", "multi_node_dep",
                                 "--nodes", "2", "--head-address", "fe80::1%eth0$(id)"])
    assert r.exit_code == 2 and "scope id" in r.output and len(r.output.strip().splitlines()) == 1
