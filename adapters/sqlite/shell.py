"""walkit.adapters.sqlite.shell is the SQL prompt of `walkit sqlite shell`: statements in, tables out."""

from __future__ import annotations

from typing import Callable, TextIO

from walkit.adapters.sqlite.status import table

HELP = """Statements end with ';' and may span lines. Results print as a table.
.tables            list the tables
.schema [TABLE]    show CREATE statements
.status            this node's role, the leader and the applied position
.quit              leave (also Ctrl-D)"""


class Shell:
    """Shell runs SQL text on a walkit.adapters.sqlite connection and prints results as tables."""

    def __init__(self, conn, echo: Callable[[str], None] = print) -> None:
        self.conn = conn
        self.echo = echo

    def run(self, sql: str) -> bool:
        """run executes every statement of `sql` (or one dot command); it returns False if one failed."""
        import sqlite3
        text = sql.strip()
        if text.startswith("."):
            return self.dot(text)
        from walkit.adapters.sqlite.statements import split
        try:
            self.conn.read_barrier()
            for statement in split(self.conn._preparing, text):
                if not statement.sql.strip():
                    continue
                cursor = self.conn.execute(statement.sql)
                rows = cursor.fetchall()
                if cursor.description:
                    self.print_rows([d[0] for d in cursor.description], rows)
                elif cursor.rowcount >= 0:
                    self.echo(f"({cursor.rowcount} row{'s' if cursor.rowcount != 1 else ''} changed)")
        except (sqlite3.Error, Exception) as exc:  # noqa: BLE001 - the prompt reports and goes on
            self.echo(f"Error: {type(exc).__name__}: {exc}")
            return False
        return True

    def print_rows(self, names: list[str], rows: list) -> None:
        """print_rows prints a header and the rows in aligned columns."""
        cells = [names] + [["NULL" if v is None else (v.hex() if isinstance(v, bytes) else str(v)) for v in row]
                           for row in rows]
        for line in table(cells):
            self.echo(line)
        self.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")

    def dot(self, command: str) -> bool:
        """dot runs a dot command."""
        word, _, arg = command.partition(" ")
        if word in (".quit", ".exit"):
            raise EOFError
        if word == ".help":
            self.echo(HELP)
        elif word == ".tables":
            return self.run("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                            "AND name NOT LIKE '\\_walkit\\_%' ESCAPE '\\' ORDER BY name;")
        elif word == ".schema":
            where = f" AND tbl_name = '{arg.strip()}'" if arg.strip() else ""
            rows = self.conn.execute("SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL AND name NOT LIKE "
                                     f"'\\_walkit\\_%' ESCAPE '\\'{where} ORDER BY rowid").fetchall()
            for (sql,) in rows:
                self.echo(sql + ";")
        elif word == ".status":
            role = "leader" if self.conn.is_leader else "follower"
            self.echo(f"{role}; leader {self.conn.leader}; applied {self.conn.position}")
        else:
            self.echo(f"Error: unknown command {word}; .help lists them")
            return False
        return True

    def loop(self, stream: TextIO, interactive: bool) -> None:
        """loop reads statements from `stream` until it ends or .quit."""
        import apsw
        buffered = ""
        while True:
            if interactive:
                self.echo_prompt("...> " if buffered else "sql> ")
            line = stream.readline()
            if not line:
                break
            if not buffered and line.strip().startswith("."):
                try:
                    self.dot(line.strip())
                except EOFError:
                    return
                continue
            buffered += line
            if apsw.complete(buffered):
                self.run(buffered)
                buffered = ""
        if buffered.strip():
            self.run(buffered)

    def echo_prompt(self, prompt: str) -> None:
        """echo_prompt shows the prompt without a newline."""
        import sys
        sys.stdout.write(prompt)
        sys.stdout.flush()
