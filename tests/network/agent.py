"""agent is the walkit client program the network tests run inside a host: `python agent.py COMMAND ARGS`.

    write URL E QW QA INCLUDE   create a ledger whose ensemble holds bookie id INCLUDE (retrying the
                                placement), print `ledger ID ENSEMBLE`, then append forever, printing
                                each acknowledged entry id; a line on stdin `close` closes the ledger
                                and prints `closed LAST`
    read URL LEDGER [recover]   open the ledger (recovering it if asked) and print `read LAC COUNT` and
                                `payloads OK|BAD` (every payload is payload-<its entry id>)
"""

from __future__ import annotations

import sys
import threading

import walkit


def write(url: str, e: str, qw: str, qa: str, include: str) -> None:
    client = walkit.Client(url)
    while True:
        writer = client.create_ledger(int(e), int(qw), int(qa), password=b"pw")
        if include in writer.metadata.ensembles[0]:
            break
        writer.close()
    print(f"ledger {writer.ledger_id} {','.join(writer.metadata.ensembles[0])}", flush=True)
    window = threading.Semaphore(50)
    lock = threading.Lock()
    closing = threading.Event()

    def acked(future) -> None:
        window.release()
        try:
            entry_id = future.result()
        except Exception as exc:  # noqa: BLE001 - report and keep going
            with lock:
                print(f"error {exc!r}", flush=True)
            return
        with lock:
            print(entry_id, flush=True)

    def close_on_request() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                closing.set()
                return

    threading.Thread(target=close_on_request, daemon=True).start()
    i = 0
    while not closing.is_set():
        if window.acquire(timeout=0.1):
            writer.append_async(f"payload-{i}".encode()).add_done_callback(acked)
            i += 1
    writer.close()
    with lock:
        print(f"closed {writer.last_add_confirmed}", flush=True)
    client.close()


def read(url: str, ledger: str, recover: str = "") -> None:
    with walkit.Client(url) as client:
        handle = client.open_ledger(int(ledger), password=b"pw", recover=recover == "recover")
        entries = list(handle.read()) if handle.last_add_confirmed >= 0 else []
        good = all(e.payload == f"payload-{e.entry_id}".encode() for e in entries)
        print(f"read {handle.last_add_confirmed} {len(entries)}", flush=True)
        print(f"payloads {'OK' if good else 'BAD'}", flush=True)


if __name__ == "__main__":
    {"write": write, "read": read}[sys.argv[1]](*sys.argv[2:])
