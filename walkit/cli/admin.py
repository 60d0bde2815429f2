"""walkit.cli.admin: the operator's commands (BookKeeper's shell).

`walkit bookies info|decommission`, `walkit recover`, `walkit underreplicated`, `walkit
auditor [status|enable|disable]`, `walkit simpletest`, `walkit bookie sanity` and `walkit
autorecovery` (a standalone auto-recovery daemon). Each takes --json for one JSON document on
stdout; long operations draw progress bars on stderr.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict

import click

from walkit.cli.common import client_for, default_metadata, friendly, main, metadata_option
from walkit.cli.servers import bookie, bookie_mode, bookies

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
passwords_option = click.option("--password", "passwords", multiple=True, metavar="PASSWORD",
                                help="A ledger password the copies may use (repeat for several) "
                                     "[default: the empty password].")


def _emit(doc, as_json: bool, lines) -> None:
    """_emit prints `doc` as JSON, or the text lines `lines(doc)` yields."""
    if as_json:
        click.echo(json.dumps(doc, sort_keys=True))
        return
    for line in lines(doc):
        click.echo(line)


class _Bars:
    """_Bars draws one click progress bar per stage of an operation, on stderr (none with --json)."""

    LABELS = {"scan": "scanning ledgers ", "mark": "marking ledgers  ", "replicate": "re-replicating   ",
              "write": "writing          ", "read": "reading back     "}

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.stage = None
        self.bar = None
        self.done = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if stage != self.stage:
            self.close()
            self.stage, self.done = stage, 0
            self.bar = click.progressbar(length=max(total, 1), label=self.LABELS.get(stage, stage),
                                         file=sys.stderr, show_pos=True)
            self.bar.__enter__()
        if done > self.done:
            self.bar.update(done - self.done)
            self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def __enter__(self) -> "_Bars":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- bookies info | decommission --------------------------------------------------------------
@bookies.command(name="info")
@metadata_option
@click.argument("address", metavar="BOOKIE")
@click.option("--no-ledgers", is_flag=True, help="Do not scan the ledgers for fragments on the bookie.")
@json_option
@friendly
def bookie_info(metadata, address, no_ledgers, as_json) -> None:
    """Show a bookie: registration, rack, mode, endpoint, and the ledgers with fragments on it.

    BOOKIE is a bookie id, as ledgers and `walkit bookies list` name it (its address, unless it was
    started with --bookie-id)."""
    from walkit.autorecovery import UnderReplication
    from walkit.autorecovery.operations import ledgers_on
    with client_for(metadata) as client, _Bars(not as_json) as bars:
        info = client.registry.info(address)
        marks = UnderReplication(client.store)
        doc = {"address": address, "registered": info is not None,
               "decommissioning": address in marks.decommissioning(),
               "lost_since_ms": marks.known_bookies().get(address)}
        if info is not None:
            doc.update(asdict(info))
            doc["mode"] = bookie_mode(info)
        if not no_ledgers:
            found = ledgers_on(client, address, bars)
            bars.close()
            doc["ledgers"] = sorted(found)
            doc["fragments"] = sum(len(starts) for starts in found.values())

    def lines(d):
        yield f"address\t{d['address']}"
        yield f"registered\t{'yes' if d['registered'] else 'no'}"
        for key in ("mode", "rack", "storage", "http", "public_key"):
            if d.get(key):
                yield f"{key}\t{d[key]}"
        if d["decommissioning"]:
            yield "decommissioning\tyes"
        if d["lost_since_ms"]:
            yield f"lost since\t{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(d['lost_since_ms'] / 1000))}"
        if "ledgers" in d:
            yield f"ledgers\t{len(d['ledgers'])} ({d['fragments']} fragments)"
    _emit(doc, as_json, lines)


@bookies.command(name="decommission")
@metadata_option
@click.argument("address", metavar="BOOKIE")
@passwords_option
@click.option("--open-grace", type=float, default=30.0, show_default=True, metavar="SECONDS",
              help="How long writers of open ledgers get to move off the bookie before those ledgers are recovered.")
@click.option("--timeout", type=float, default=3600.0, show_default=True, metavar="SECONDS",
              help="Give up (the bookie stays draining) after this long.")
@click.option("--cancel", is_flag=True, help="End a decommission: the bookie becomes writable again.")
@json_option
@friendly
def decommission(metadata, address, passwords, open_grace, timeout, cancel, as_json) -> None:
    """Move every fragment off the running bookie BOOKIE, then say it can be stopped.

    The bookie turns draining at once: new ledgers avoid it and writers replace it at their
    next add. Its fragments are copied to other bookies (placement rules kept) and the ledgers'
    metadata rewritten; open ledgers whose writers keep it past --open-grace are recovered.
    """
    from walkit.autorecovery.operations import cancel_decommission, decommission_bookie
    with client_for(metadata) as client:
        if cancel:
            cancel_decommission(client, address)
            _emit({"bookie": address, "cancelled": True}, as_json,
                  lambda d: [f"decommission of {address} cancelled: it is writable again"])
            return
        with _Bars(not as_json) as bars:
            report = decommission_bookie(client, address, passwords=passwords or ("",), open_grace_s=open_grace,
                                         timeout=timeout, progress=bars)
    _emit(report, as_json, lambda d: [
        f"moved {d['fragments']} fragments of {len(d['ledgers'])} ledgers off {address} "
        f"({d['entries_copied']} entries, {d['bytes_copied']} bytes) in {d['seconds']:.1f} s",
        f"bookie {address} holds no ledger fragment any more: it can be stopped"])


@bookies.command(name="format-and-rejoin")
@metadata_option
@click.argument("address", metavar="BOOKIE")
@json_option
@friendly
def format_and_rejoin(metadata, address, as_json) -> None:
    """Let the stopped bookie BOOKIE start again on an empty (replaced or wiped) disk.

    A bookie whose storage was emptied refuses to start: it would answer "no such entry" for
    entries it had acknowledged. This removes its cookie (the cluster's record of its disk), so
    its next start formats the storage as a new disk, and marks every ledger with a fragment on
    BOOKIE for re-replication: auto-recovery copies the entries back to the new disk once it
    runs (or to other bookies). Clients never count the new disk's answers for fragments it
    joined with its old disk. Start the bookie once this returns.
    """
    from walkit.autorecovery.operations import format_and_rejoin as rejoin
    with client_for(metadata) as client, _Bars(not as_json) as bars:
        report = rejoin(client, address, progress=bars)
    _emit(report, as_json, lambda d: [
        f"bookie {address} may start on a new disk (its cookie, disk {d['old_disk'] or 'none'}, is removed)",
        f"{len(d['ledgers'])} ledgers ({d['fragments']} fragments) are marked: auto-recovery copies their entries "
        f"back once it runs (see `walkit underreplicated`)"])


# -- recover ---------------------------------------------------------------------------------
@main.command()
@metadata_option
@click.argument("address", metavar="BOOKIE")
@passwords_option
@click.option("--skip-open", is_flag=True,
              help="Leave unclosed ledgers whose last fragment is on the bookie to their writers "
                   "(auto-recovery recovers them after its grace period) instead of recovering them now.")
@click.option("--timeout", type=float, default=3600.0, show_default=True, metavar="SECONDS",
              help="Give up after this long.")
@json_option
@friendly
def recover(metadata, address, passwords, skip_open, timeout, as_json) -> None:
    """Re-replicate the data of the dead bookie BOOKIE now (without waiting for the auditor).

    Every ledger with a fragment on BOOKIE is marked and repaired in this process: entries are
    copied from surviving replicas to bookies chosen by the placement policy and the ledgers'
    metadata rewritten. Works while auto-recovery is disabled.
    """
    from walkit.autorecovery.operations import recover_bookie
    with client_for(metadata) as client:
        if client.registry.info(address) is not None:
            raise click.ClickException(f"bookie {address} is running; use `walkit bookies decommission {address}` "
                                       "to move its data away")
        with _Bars(not as_json) as bars:
            report = recover_bookie(client, address, passwords=passwords or ("",), force_open=not skip_open,
                                    timeout=timeout, progress=bars)
    _emit(report, as_json, lambda d: [
        f"re-replicated {d['fragments']} fragments of {len(d['ledgers'])} ledgers from {address} "
        f"({d['entries_copied']} entries, {d['bytes_copied']} bytes, {d['ledgers_recovered']} open ledgers "
        f"recovered) in {d['seconds']:.1f} s"])


# -- underreplicated -------------------------------------------------------------------------
@main.command()
@metadata_option
@click.option("--bookie", "address", default=None, help="Only ledgers marked for this bookie.")
@json_option
@friendly
def underreplicated(metadata, address, as_json) -> None:
    """List the ledgers marked under-replicated: the bookies to repair and why, and who works on them."""
    from walkit.autorecovery import UnderReplication
    with client_for(metadata) as client:
        marks = UnderReplication(client.store)
        rows = []
        for ledger_id, mark in sorted(marks.marks().items()):
            if address is not None and address not in mark.bookies:
                continue
            rows.append({"ledger": ledger_id, "bookies": mark.bookies, "entries": mark.entries, "bytes": mark.bytes,
                         "marked_ms": mark.marked_ms, "worker": marks.lock_holder(ledger_id), "error": mark.error})

    def lines(found):
        if not found:
            yield "no under-replicated ledgers"
        for r in found:
            age = max(0.0, time.time() - r["marked_ms"] / 1000)
            bookies_text = ", ".join(f"{b} ({why})" for b, why in sorted(r["bookies"].items()))
            yield (f"{r['ledger']}\t{bookies_text}\t{r['entries']} entries\tmarked {age:.0f} s ago"
                   + (f"\tworker {r['worker']}" if r["worker"] else "") + (f"\terror: {r['error']}" if r["error"] else ""))
    _emit(rows, as_json, lines)


# -- auditor ---------------------------------------------------------------------------------
@main.group(invoke_without_command=True)
@metadata_option
@json_option
@click.pass_context
def auditor(ctx, metadata, as_json) -> None:
    """Show auto-recovery's state, or switch it on and off for the whole cluster (default: status)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(auditor_status, metadata=metadata, as_json=as_json)


def _auditor_doc(client) -> dict:
    from walkit.autorecovery import UnderReplication
    from walkit.autorecovery.auditor import ELECTION
    from walkit.election import LeaderElection
    marks = UnderReplication(client.store)
    status = marks.status()
    return {"enabled": marks.enabled(), "auditor": LeaderElection(client.store, ELECTION, "walkit-cli").leader(),
            "underreplicated_ledgers": len(marks.ledger_ids()), "decommissioning": sorted(marks.decommissioning()),
            "lost": {a: since for a, since in marks.known_bookies().items() if since is not None},
            "last_status": status}


def _auditor_lines(d):
    yield f"auto-recovery\t{'enabled' if d['enabled'] else 'DISABLED'}"
    yield f"auditor\t{d['auditor'] or 'none elected'}"
    yield f"under-replicated ledgers\t{d['underreplicated_ledgers']}"
    for address, since in sorted(d["lost"].items()):
        yield f"lost bookie\t{address} (gone {max(0.0, time.time() - since / 1000):.0f} s)"
    for address in d["decommissioning"]:
        yield f"decommissioning\t{address}"
    status = d["last_status"]
    if status:
        yield (f"audits\t{status.get('audits', 0)} (lost bookie delay {status.get('lost_bookie_delay_s')} s), "
               f"periodic checks {status.get('checks', 0)} (every {status.get('periodic_check_s')} s)")


@auditor.command(name="status")
@metadata_option
@json_option
@friendly
def auditor_status(metadata, as_json) -> None:
    """Show whether auto-recovery is on, who audits, lost bookies and under-replicated ledgers."""
    with client_for(metadata) as client:
        doc = _auditor_doc(client)
    _emit(doc, as_json, _auditor_lines)


@auditor.command(name="enable")
@metadata_option
@json_option
@friendly
def auditor_enable(metadata, as_json) -> None:
    """Switch auto-recovery on for the whole cluster (auditing and re-replication resume)."""
    _switch(metadata, True, as_json)


@auditor.command(name="disable")
@metadata_option
@json_option
@friendly
def auditor_disable(metadata, as_json) -> None:
    """Switch auto-recovery off for the whole cluster (nothing is marked or copied until enabled)."""
    _switch(metadata, False, as_json)


def _switch(metadata, enabled: bool, as_json: bool) -> None:
    from walkit.autorecovery import UnderReplication
    with client_for(metadata) as client:
        UnderReplication(client.store).set_enabled(enabled)
    _emit({"enabled": enabled}, as_json, lambda d: [f"auto-recovery {'enabled' if enabled else 'disabled'}"])


# -- simpletest, bookie sanity ---------------------------------------------------------------
@main.command()
@metadata_option
@click.option("--ensemble", "-e", type=int, default=3, show_default=True, help="Ensemble size E.")
@click.option("--write-quorum", "-w", type=int, default=2, show_default=True, help="Write quorum Qw.")
@click.option("--ack-quorum", "-a", type=int, default=2, show_default=True, help="Ack quorum Qa.")
@click.option("--entries", "-n", type=click.IntRange(min=1), default=1000, show_default=True, help="Entries to write.")
@click.option("--size", type=click.IntRange(min=0), default=1024, show_default=True, help="Bytes per entry.")
@json_option
@friendly
def simpletest(metadata, ensemble, write_quorum, ack_quorum, entries, size, as_json) -> None:
    """Write a ledger, read it back, check every entry, report latencies, then delete it."""
    import os
    with client_for(metadata) as client, _Bars(not as_json) as bars:
        writer = client.create_ledger(ensemble, write_quorum, ack_quorum, password=b"simpletest")
        try:
            payloads = [os.urandom(size) for _ in range(entries)]
            latencies: list[float] = []
            started = time.perf_counter()
            futures = []
            for payload in payloads:
                sent = time.perf_counter()
                future = writer.append_async(payload)
                future.add_done_callback(lambda f, sent=sent: latencies.append(time.perf_counter() - sent))
                futures.append(future)
            for done, future in enumerate(futures, 1):
                future.result()
                if done % 100 == 0 or done == entries:
                    bars("write", done, entries)
            write_s = time.perf_counter() - started
            writer.close()
            started = time.perf_counter()
            reader = client.open_ledger(writer.ledger_id, password=b"simpletest")
            bad = sum(1 for entry in reader.read() if entry.payload != payloads[entry.entry_id])
            read_s = time.perf_counter() - started
            bars.close()
        finally:
            client.delete_ledger(writer.ledger_id)
        ordered = sorted(latencies)
        doc = {"ledger": writer.ledger_id, "entries": entries, "size": size, "ok": bad == 0, "mismatches": bad,
               "write_s": round(write_s, 4), "read_s": round(read_s, 4),
               "appends_per_s": round(entries / write_s, 1),
               "latency_ms": {"p50": round(statistics.median(ordered) * 1000, 3),
                              "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
                              "max": round(ordered[-1] * 1000, 3)}}
    _emit(doc, as_json, lambda d: [
        f"{'OK' if d['ok'] else 'FAILED'}: wrote {d['entries']} entries of {d['size']} bytes to ledger {d['ledger']} "
        f"and read them back ({d['mismatches']} mismatches)",
        f"write {d['write_s']:.3f} s ({d['appends_per_s']:,.0f} appends/s), latency p50 {d['latency_ms']['p50']} ms, "
        f"p99 {d['latency_ms']['p99']} ms, max {d['latency_ms']['max']} ms; read back in {d['read_s']:.3f} s"])
    if not doc["ok"]:
        sys.exit(1)


@bookie.command(name="sanity")
@metadata_option
@click.argument("addresses", nargs=-1, metavar="[BOOKIE]...")
@click.option("--entries", "-n", type=click.IntRange(min=1, max=10000), default=10, show_default=True,
              help="Entries to write and read back.")
@json_option
@friendly
def sanity(metadata, addresses, entries, as_json) -> None:
    """Write entries to each bookie, read them back and verify them (default: every registered bookie).

    Exits with status 1 if any bookie failed.
    """
    from walkit.autorecovery.operations import sanity_check
    with client_for(metadata) as client:
        targets = list(addresses) or sorted(client.bookies())
        if not targets:
            raise click.ClickException("no registered bookies to check")
        reports = [sanity_check(client, address, entries=entries) for address in targets]
    _emit(reports, as_json, lambda rs: [
        f"{r['bookie']}\t{'OK' if r['ok'] else 'FAILED'}\t"
        + (f"add {r.get('add_ms')} ms, read {r.get('read_ms')} ms" if r["ok"] else r.get("error", "")) for r in rs])
    if not all(r["ok"] for r in reports):
        sys.exit(1)


# -- autorecovery (standalone) ---------------------------------------------------------------
@main.command(name="autorecovery")
@metadata_option
@click.option("--name", default=None, help="Name in elections and locks [default: autorecovery-<random>].")
@click.option("--http-port", type=int, default=None, help="Serve /metrics, /health and /ready on this port.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface of the HTTP endpoint.")
@click.option("--lost-bookie-delay", type=float, default=60.0, show_default=True, metavar="SECONDS",
              help="A bookie unregistered this long is lost.")
@click.option("--open-ledger-grace", type=float, default=30.0, show_default=True, metavar="SECONDS",
              help="How long an unclosed ledger's writer may keep a lost bookie.")
@click.option("--periodic-check-interval", type=float, default=86400.0, show_default=True, metavar="SECONDS",
              help="Seconds between checks of every ledger (0: never).")
@click.option("--audit-rate", type=float, default=500.0, show_default=True, help="Auditor metadata reads per second.")
@click.option("--recovery-password", "passwords", multiple=True, metavar="PASSWORD",
              help="A ledger password the copies may use (repeat for several) [default: the empty password].")
@click.option("--auditor/--no-auditor", default=True, show_default=True, help="Be a candidate for the auditor.")
@click.option("--worker/--no-worker", default=True, show_default=True, help="Run a replication worker.")
@friendly
def autorecovery(metadata, name, http_port, host, lost_bookie_delay, open_ledger_grace, periodic_check_interval,
                 audit_rate, passwords, auditor, worker) -> None:
    """Run an auditor candidate and a replication worker outside any bookie, until SIGTERM or Ctrl-C."""
    import signal
    import threading

    from walkit.autorecovery import AutoRecovery, RecoveryConfig
    from walkit.autorecovery.daemon import random_name
    from walkit.metrics import REGISTRY, HttpEndpoint, new_registry
    config = RecoveryConfig(lost_bookie_delay_s=lost_bookie_delay, open_grace_s=open_ledger_grace,
                            periodic_check_s=periodic_check_interval, audit_rate=audit_rate,
                            passwords=tuple(passwords) or ("",), auditor=auditor, worker=worker)
    daemon = AutoRecovery(metadata or default_metadata(), name or random_name(), config).start()
    endpoint = None
    if http_port is not None:
        endpoint = HttpEndpoint(host, http_port, [new_registry(daemon.collector, process=False), REGISTRY])
        click.echo(f"metrics on http://{endpoint.address}/metrics", err=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    click.echo(f"auto-recovery {daemon.name} running; Ctrl-C to stop", err=True)
    try:
        stop.wait()
    finally:
        if endpoint is not None:
            endpoint.close()
        daemon.close()
