"""The `walkit` command line against a running LocalCluster (real bookie processes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

import walkit
from walkit.cli import main
from walkit.local import LocalCluster

from .helpers import child_pids, pid_alive

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(bookies=3, data_dir=str(tmp_path_factory.mktemp("cli") / "cluster"),
                      bookie_args=("--gc-interval", "0.2")) as cluster:
        yield cluster


@pytest.fixture
def walkit_cli(cluster, tmp_path, monkeypatch):
    """walkit_cli runs `walkit ARGS --metadata <cluster>` in-process and returns the click Result."""
    monkeypatch.chdir(tmp_path)            # a command that ignored --metadata would create ./walkit-data here
    monkeypatch.delenv("WALKIT_METADATA", raising=False)
    runner = CliRunner()

    def run(*args: str, input: str | bytes | None = None, metadata: str | None = None, ok: bool = True):
        result = runner.invoke(main, [*args, "--metadata", metadata or cluster.metadata_url], input=input)
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result
    return run


def _ledger_id(result) -> int:
    return int(result.stdout.strip())


def test_ledger_create_then_read_prints_the_entries(walkit_cli):
    ledger_id = _ledger_id(walkit_cli("ledger", "create", "a", "b", "c"))
    assert walkit_cli("ledger", "read", str(ledger_id)).stdout == "0\ta\n1\tb\n2\tc\n"
    assert walkit_cli("ledger", "read", str(ledger_id), "--first", "1", "--last", "1").stdout == "1\tb\n"
    as_json = [json.loads(line) for line in
               walkit_cli("ledger", "read", str(ledger_id), "--format", "json").stdout.splitlines()]
    assert as_json == [{"entry_id": 0, "payload": "a"}, {"entry_id": 1, "payload": "b"},
                       {"entry_id": 2, "payload": "c"}]
    assert walkit_cli("ledger", "read", str(ledger_id), "--format", "hex").stdout == "0\t61\n1\t62\n2\t63\n"
    assert not os.path.exists("walkit-data")


def test_ledger_append_from_stdin_then_info_list_and_delete(walkit_cli, cluster):
    created = _ledger_id(walkit_cli("ledger", "create", "a", "b", "c"))
    lines = "".join(f"line {i}\n" for i in range(100))
    result = walkit_cli("ledger", "append", input=lines)
    appended = _ledger_id(result)
    assert f"appended 100 entries to ledger {appended}" in result.stderr
    assert appended != created

    read = walkit_cli("ledger", "read", str(appended)).stdout.splitlines()
    assert read == [f"{i}\tline {i}" for i in range(100)]

    info = json.loads(walkit_cli("ledger", "info", str(appended)).stdout)
    assert info["state"] == "CLOSED"
    assert info["last_entry_id"] == 99
    assert info["ledger_id"] == appended
    assert (info["ensemble_size"], info["write_quorum"], info["ack_quorum"]) == (3, 2, 2)
    assert info["ensembles"][0][0] == 0 and set(info["ensembles"][0][1]) == set(cluster.addresses)

    listed = {int(line.split("\t")[0]): line for line in walkit_cli("ledger", "list").stdout.splitlines()}
    assert created in listed and appended in listed
    assert "\tCLOSED\tlast=99\tE=3 Qw=2 Qa=2" in listed[appended]
    assert "\tCLOSED\tlast=2\t" in listed[created]

    assert walkit_cli("ledger", "delete", str(appended)).stdout.strip() == f"deleted ledger {appended}"
    listed = {int(line.split("\t")[0]) for line in walkit_cli("ledger", "list").stdout.splitlines()}
    assert appended not in listed and created in listed
    gone = walkit_cli("ledger", "info", str(appended), ok=False)
    assert gone.exit_code == 1 and "NoSuchLedger" in gone.stderr


def test_ledger_append_from_a_file_with_quorum_options(walkit_cli, tmp_path):
    source = tmp_path / "entries.txt"
    source.write_bytes(b"".join(b"row %d\n" % i for i in range(10)))
    ledger_id = _ledger_id(walkit_cli("ledger", "append", "-f", str(source), "-e", "3", "-w", "3", "-a", "2",
                                      "--digest", "hmac-sha256", "--password", "pw"))
    info = json.loads(walkit_cli("ledger", "info", str(ledger_id)).stdout)
    assert (info["write_quorum"], info["ack_quorum"], info["digest_type"]) == (3, 2, "hmac-sha256")
    assert walkit_cli("ledger", "read", str(ledger_id), "--password", "pw").stdout.splitlines()[-1] == "9\trow 9"
    refused = walkit_cli("ledger", "read", str(ledger_id), "--password", "wrong", ok=False)
    assert refused.exit_code == 1 and "Unauthorized" in refused.stderr


def test_cli_errors_are_one_line_messages_and_exit_1(walkit_cli):
    missing = walkit_cli("ledger", "read", "987654321", ok=False)
    assert missing.exit_code == 1 and "NoSuchLedger" in missing.stderr
    too_big = walkit_cli("ledger", "create", "-e", "4", "x", ok=False)
    assert too_big.exit_code == 1 and "NotEnoughBookies" in too_big.stderr
    bad_quorum = walkit_cli("ledger", "create", "-e", "2", "-w", "3", "x", ok=False)
    assert bad_quorum.exit_code == 1 and "ConfigError" in bad_quorum.stderr
    for result in (missing, too_big, bad_quorum):
        assert "Traceback" not in result.output


def test_bookies_list_shows_three_writable_bookies(walkit_cli, cluster):
    lines = walkit_cli("bookies", "list").stdout.splitlines()
    rows = [line.split("\t") for line in lines]
    assert sorted(r[0] for r in rows) == sorted(cluster.addresses)
    assert all(r[1] == "writable" and r[2].startswith("files://") for r in rows)


def test_plugins_lists_the_installed_schemes():
    result = CliRunner().invoke(main, ["plugins"])
    assert result.exit_code == 0, result.output
    assert "storage:" in result.stdout and "metadata:" in result.stdout
    assert "memory://" in result.stdout and "sqlite://" in result.stdout


@pytest.mark.parametrize("command", [["ledger", "list"], ["ledger", "info", "1"], ["bookies", "list"],
                                     ["ledger", "create", "x"]])
def test_unknown_metadata_scheme_fails_and_lists_the_installed_ones(walkit_cli, command):
    result = walkit_cli(*command, metadata="nope://x", ok=False)
    assert result.exit_code != 0
    assert "nope" in result.stderr and "installed: " in result.stderr
    installed = result.stderr.split("installed: ", 1)[1].split()
    assert "sqlite" in [name.strip(",.") for name in installed]
    assert "Traceback" not in result.output


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    ctx = click.Context(group)
    for name in group.list_commands(ctx):          # the adapters' groups too, which walkit imports on first use
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            paths += _command_paths(command, prefix + (name,))
        else:
            paths.append(prefix + (name,))
    return paths


@pytest.mark.parametrize("path", _command_paths(main), ids=lambda p: " ".join(p) or "walkit")
def test_every_command_has_help(path):
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage:")
    assert " ".join(path) in result.stdout.splitlines()[0]


def test_the_installed_walkit_executable_runs():
    executable = shutil.which("walkit") or os.path.join(os.path.dirname(sys.executable), "walkit")
    assert os.path.exists(executable), "the `walkit` console script is not installed"
    result = subprocess.run([executable, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: walkit")
    for command in ("bookie", "bookies", "ledger", "local", "plugins"):
        assert f"\n  {command} " in result.stdout


#: Runs argv[1:] with SIGINT at its default action (exec keeps a default disposition, and an ignored one).
AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.argv[1], sys.argv[1:])")


@pytest.mark.parametrize("bookies, security", [(3, False), (1, False), (3, True)],
                         ids=["3-bookies", "1-bookie", "3-secured-bookies"])
def test_walkit_local_runs_a_cluster_with_a_demo_until_ctrl_c(tmp_path, bookies, security):
    executable = shutil.which("walkit") or os.path.join(os.path.dirname(sys.executable), "walkit")
    # Started as from a terminal, where Ctrl-C is SIGINT's default action: a suite launched in the
    # background of a script runs with SIGINT ignored, and exec would pass that on to `walkit local`.
    process = subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, executable, "local", "--bookies", str(bookies),
                                "--data-dir", str(tmp_path / "wd"), "--demo", *(["--security"] if security else [])],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    children: list[int] = []
    try:
        lines = []
        while not lines or not lines[-1].startswith("Ctrl-C to stop."):
            line = process.stdout.readline()
            assert line, f"`walkit local` ended early: {''.join(lines)}{process.stderr.read()}"
            lines.append(line)
        output = "".join(lines)
        assert f"walkit local cluster: {bookies} bookies at 127.0.0.1:" in output
        assert "demo: wrote 1000 entries" in output and "demo: read back 1000 entries" in output
        metadata_url = next(l for l in lines if l.startswith("metadata: ")).split(": ", 1)[1].strip()
        key = None
        if security:
            key = str(tmp_path / "wd" / "keys" / "client.key_secret")
            assert f"security: on; client key pair {key}" in output
        with walkit.Client(metadata_url, key=key) as client:
            assert len(client.bookies()) == bookies
            assert all(bool(info.public_key) == security for info in client.bookies().values())
            (ledger_id,) = client.list_ledgers()
            assert client.ledger_metadata(ledger_id).last_entry_id == 999
        children = child_pids(process.pid)
        assert len(children) == bookies
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert out.strip().endswith("stopping")
        assert not [p for p in children if pid_alive(p)]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        for pid in children:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_bench_reports_every_phase_and_a_sustained_run_by_interval(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, ["bench", "--entries", "600", "--window", "60", "--batch", "20", "--runs", "1",
                                       "--storage", "memory", "--duration", "2", "--interval", "1",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    for phrase in ("appends (window 60)", "append_many (batches of 20", "one append in flight",
                   "catch-up read of a closed ledger", "s (window 60): ", "recovery of an open ledger"):
        assert phrase in result.output, result.output
    data = json.loads(out.read_text())
    assert data["append_many"]["runs"][0]["entries"] == 600
    if os.path.exists("/proc/self/stat"):        # where each phase's CPU went (Linux)
        assert result.output.count("cpu per entry: client") == 3, result.output
        assert len(data["append"]["cpu"]["bookie_cores"]) == 3 and data["append"]["cpu"]["client_us_per_entry"] > 0
    assert data["catch_up_read"]["runs"][0]["entries"] == 600
    assert data["catch_up_read"]["cold"] == (os.geteuid() == 0)
    intervals = data["sustained"]["intervals"]
    assert len(intervals) >= 2 and all(part["entries_per_s"] > 0 for part in intervals)
    assert data["sustained"]["entries"] > 0
    # Each interval says what the CPU did, beside the speed probe.
    assert all(part["probe_ms"] is not None and part["probe_ms"] > 0 for part in intervals)
    assert data["sustained"]["probe_ms"] > 0 and "speed probe" in result.output
    # ... and, from the two, how the intervals compare at equal machine speed.
    adjusted = data["sustained"]["speed_adjusted"]
    assert [part["entries_per_probe"] for part in intervals] == pytest.approx(
        [part["entries_per_s"] * part["probe_ms"] / 1000 for part in intervals])
    assert adjusted["entries_per_probe"] == [part["entries_per_probe"] for part in intervals]
    assert adjusted["lowest"] == pytest.approx(min(adjusted["entries_per_probe"]) / adjusted["median"])
    assert sum(line.endswith(" entries per probe") for line in result.output.splitlines()) == len(intervals)
    assert "at equal machine speed (an estimate)" in result.output
    if os.path.exists("/proc/self/stat"):
        assert all(part["cpu"]["client_us_per_entry"] > 0 and len(part["cpu"]["bookie_cores"]) == 3
                   for part in intervals)
        assert result.output.count("us, machine") == len(intervals), result.output
    bad = CliRunner().invoke(main, ["bench", "--batch", "0"])
    assert bad.exit_code != 0 and "batch must be at least 1" in bad.output


def test_bench_warms_each_cluster_up_before_its_first_timed_phase(monkeypatch):
    import walkit.bench as bench
    calls = []
    real = bench.pipelined

    def recorded(submit, count, window, tick=None):
        calls.append((count, window))
        return real(submit, count, window, tick)
    monkeypatch.setattr(bench, "pipelined", recorded)
    result = CliRunner().invoke(main, ["bench", "--entries", "300", "--window", "30", "--batch", "10", "--runs", "1",
                                       "--storage", "memory"])
    assert result.exit_code == 0, result.output
    assert calls[:2] == [(30, 30), (300, 30)]            # one untimed window, then the pipelined phase


def test_bench_peers_says_where_the_peers_moved():
    """`walkit bench --peers` (peers are benchmarks/peers_bench.py now) names the script instead of running."""
    result = CliRunner().invoke(main, ["bench", "--peers", "nats", "--storage", "memory"])
    assert result.exit_code == 2
    assert "python benchmarks/peers_bench.py --peers nats" in result.output, result.output
