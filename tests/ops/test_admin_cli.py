"""The operator's commands: --help everywhere (fast), and --json against real bookie processes (slow)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.integration.helpers import wait_until
from tests.ops.helpers import PASSWORD, fragments_on
from walkit.cli import main
from walkit.client.api import Client
from walkit.local import LocalCluster

COMMANDS = [["bookies", "list"], ["bookies", "info"], ["bookies", "decommission"], ["recover"], ["underreplicated"],
            ["auditor"], ["auditor", "status"], ["auditor", "enable"], ["auditor", "disable"], ["simpletest"],
            ["bookie", "sanity"], ["ledger", "info"], ["ledger", "read"], ["autorecovery"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_admin_command_has_help_and_a_json_option(command):
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    if command != ["autorecovery"]:
        assert "--json" in result.output


def test_the_bookie_command_still_runs_a_bookie_and_lists_sanity():
    result = CliRunner().invoke(main, ["bookie", "--help"])
    assert result.exit_code == 0
    assert "--lost-bookie-delay" in result.output and "--rack" in result.output and "sanity" in result.output


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=4, data_dir=str(tmp_path_factory.mktemp("cli")), http=True, racks=["a", "b", "c", "c"],
                      bookie_args=("--lost-bookie-delay", "3600", "--recovery-password", "pw")) as cluster:
        yield cluster


def walkit(cluster, *args, ok: bool = True):
    result = CliRunner().invoke(main, [*args, "--metadata", cluster.metadata_url])
    if ok:
        assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
    return result


@pytest.mark.slow
def test_json_outputs_of_the_admin_commands(cluster):
    listed = json.loads(walkit(cluster, "bookies", "list", "--json").stdout)
    assert sorted(b["address"] for b in listed) == sorted(cluster.addresses)
    assert sorted(b["rack"] for b in listed) == ["a", "b", "c", "c"] and all(b["http"] for b in listed)
    test = json.loads(walkit(cluster, "simpletest", "-n", "300", "--size", "64", "--json").stdout)
    assert test["ok"] and test["entries"] == 300 and test["latency_ms"]["p99"] >= test["latency_ms"]["p50"] > 0
    sanity = json.loads(walkit(cluster, "bookie", "sanity", "--json").stdout)
    assert sorted(r["bookie"] for r in sanity) == sorted(cluster.addresses) and all(r["ok"] for r in sanity)
    with Client(cluster.metadata_url) as client:
        writer = client.create_ledger(3, 2, 2, password=PASSWORD)
        for future in [writer.append_async(b"e%d" % i) for i in range(100)]:
            future.result()
        writer.close()
    info = json.loads(walkit(cluster, "ledger", "info", str(writer.ledger_id), "--json").stdout)
    assert info["fragments"] == [{"first": 0, "last": 99, "bookies": list(writer.metadata.ensembles[0])}]
    assert info["under_replicated"] is None
    lines = walkit(cluster, "ledger", "read", str(writer.ledger_id), "--password", "pw", "--json").stdout.splitlines()
    assert [json.loads(line)["payload"] for line in lines] == [f"e{i}" for i in range(100)]
    bookie = json.loads(walkit(cluster, "bookies", "info", writer.metadata.ensembles[0][0], "--json").stdout)
    assert bookie["registered"] and bookie["mode"] == "writable" and writer.ledger_id in bookie["ledgers"]
    status = json.loads(walkit(cluster, "auditor", "--json").stdout)
    assert status["enabled"] and status["auditor"] in cluster.addresses and status["underreplicated_ledgers"] == 0
    assert json.loads(walkit(cluster, "auditor", "disable", "--json").stdout) == {"enabled": False}
    assert json.loads(walkit(cluster, "auditor", "status", "--json").stdout)["enabled"] is False
    assert json.loads(walkit(cluster, "auditor", "enable", "--json").stdout) == {"enabled": True}
    assert json.loads(walkit(cluster, "underreplicated", "--json").stdout) == []


@pytest.mark.slow
def test_recover_copies_a_dead_bookies_data_and_refuses_a_live_one(cluster):
    with Client(cluster.metadata_url) as client:
        writer = client.create_ledger(3, 2, 2, password=PASSWORD)
        for future in [writer.append_async(b"r%d" % i) for i in range(500)]:
            future.result()
        writer.close()
        victim = writer.metadata.ensembles[0][1]
        refused = walkit(cluster, "recover", victim, ok=False)
        assert refused.exit_code == 1 and "is running" in refused.stderr and "decommission" in refused.stderr
        cluster.kill_bookie(cluster.addresses.index(victim))
        wait_until(lambda: victim not in client.bookies(), timeout=30)
        report = json.loads(walkit(cluster, "recover", victim, "--password", "pw", "--json").stdout)
        assert writer.ledger_id in report["ledgers"] and report["entries_copied"] > 0
        assert fragments_on(client, victim) == []
        reader = client.open_ledger(writer.ledger_id, password=PASSWORD)
        assert [e.payload for e in reader.read()] == [b"r%d" % i for i in range(500)]


@pytest.mark.slow
def test_bad_input_gets_one_clear_line(cluster):
    unknown = walkit(cluster, "bookies", "decommission", "10.9.9.9:1", ok=False)
    assert unknown.exit_code == 1 and "not registered" in unknown.stderr and "Traceback" not in unknown.stderr
    missing = walkit(cluster, "ledger", "info", "987654", "--json", ok=False)
    assert missing.exit_code == 1 and "NoSuchLedger" in missing.stderr
    nobody = json.loads(walkit(cluster, "bookies", "info", "10.9.9.9:1", "--no-ledgers", "--json").stdout)
    assert nobody["registered"] is False
