"""A log writer process for crash and fencing tests.

    python tests/integration/log_writer_process.py METADATA_URL LOG PREFIX COUNT [roll]

Opens LOG as its writer, appends COUNT records PREFIX-0, PREFIX-1, ... one at a time and prints
each acknowledged position as "acked LEDGER:ENTRY PAYLOAD". With COUNT = 0 it appends forever.
With "roll" it then rolls the log (a failpoint named in WALKIT_FAILPOINTS may kill it there) and prints
"rolled". If it is fenced it prints "fenced" and exits 0.
"""

from __future__ import annotations

import itertools
import sys

import walkit
from walkit.errors import LedgerFenced


def main() -> None:
    url, name, prefix, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with walkit.Client(url) as client:
        writer = client.open_log(name)
        print("opened", flush=True)
        try:
            for i in itertools.count() if count == 0 else range(count):
                payload = f"{prefix}-{i}"
                position = writer.append(payload.encode())
                print(f"acked {position} {payload}", flush=True)
            if "roll" in sys.argv[5:]:
                writer.roll()
                print("rolled", flush=True)
            writer.close()
        except LedgerFenced:
            print("fenced", flush=True)


if __name__ == "__main__":
    main()
