"""A writer process for crash tests: creates a ledger, prints its id, then appends forever,
printing each acknowledged entry id on its own line as soon as it is acknowledged.

    python tests/integration/writer_process.py METADATA_URL PASSWORD [ENSEMBLE QW QA]
"""

from __future__ import annotations

import sys
import threading

import walkit


def main() -> None:
    url, password = sys.argv[1], sys.argv[2].encode()
    e, qw, qa = (int(x) for x in sys.argv[3:6]) if len(sys.argv) >= 6 else (3, 2, 2)
    client = walkit.Client(url)
    writer = client.create_ledger(e, qw, qa, password=password)
    print(f"ledger {writer.ledger_id}", flush=True)
    window = threading.Semaphore(200)
    lock = threading.Lock()

    def acked(future) -> None:
        window.release()
        try:
            entry_id = future.result()
        except Exception as exc:  # noqa: BLE001 - report and keep the stream going
            with lock:
                print(f"error {exc!r}", flush=True)
            return
        with lock:
            print(entry_id, flush=True)

    i = 0
    while True:
        window.acquire()
        writer.append_async(f"payload-{i}".encode()).add_done_callback(acked)
        i += 1


if __name__ == "__main__":
    main()
