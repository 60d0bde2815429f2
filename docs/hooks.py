"""docs/hooks.py writes the reference parts of the site from the code at build time (an MkDocs hook).

A page asks for a generated part with a marker line of its own:

- `<!-- walkit:bookie-config -->` becomes the bookie's configuration keys, from
  `walkit.bookie.config` (`_RULES`, the `BookieConfig` fields and their defaults, its docstring)
  and the options of `walkit bookie` that set each key;
- `<!-- walkit:cli -->` becomes every `walkit` command, walked from `walkit.cli:main`: usage,
  help and options, as `--help` prints them.

Nothing generated is stored in the repository, so the reference cannot drift from the code;
edit the docstrings and the click options instead. mkdocs.yml registers this file under
`hooks:`, and `mkdocs build --strict` fails if a marker names nothing this file knows.
"""

from __future__ import annotations

import dataclasses
import inspect
import re

import click

MARKER = re.compile(r"^<!-- walkit:([a-z-]+) -->$", re.MULTILINE)
MIB = 1024 * 1024


def on_page_markdown(markdown: str, page, config, files) -> str:
    """on_page_markdown replaces each marker of a page with the part it names."""
    def generate(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: no generated part named {name!r} "
                             f"(known: {', '.join(sorted(GENERATORS))})")
        return GENERATORS[name]()
    return MARKER.sub(generate, markdown)


# -- shared -----------------------------------------------------------------------------------

def escape(text: str) -> str:
    """escape keeps Markdown from reading help text as markup, except `code spans`."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(part)
        else:
            part = part.replace("\\", "\\\\").replace("*", "\\*").replace("_", "\\_")
            out.append(part.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|"))
    return "".join(out)


def cell(text: str) -> str:
    """cell is text escaped for one table cell (no line breaks).

    A `code span` holding `|` becomes HTML: a table would split it, and an escaped pipe shows its
    backslash inside backticks.
    """
    def code(match: re.Match) -> str:
        inner = match.group(1).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return "<code>" + inner.replace("|", "&#124;") + "</code>"
    text = re.sub(r"`([^`]*\|[^`]*)`", code, " ".join(text.split()))
    parts = re.split(r"(<code>.*?</code>)", text)
    return "".join(part if i % 2 else escape(part) for i, part in enumerate(parts))


def paragraphs(doc: str) -> str:
    """paragraphs turns click's help text into Markdown: `\\b` blocks stay as written, in code."""
    out = []
    for block in re.split(r"\n\s*\n", inspect.cleandoc(doc or "")):
        if block.startswith("\b"):
            out.append("```text\n" + block[1:].strip("\n") + "\n```")
        else:
            out.append(escape(" ".join(block.split())))
    return "\n\n".join(out)


# -- the bookie's configuration ------------------------------------------------------------------

def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required (`walkit bookie`: the embedded store)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= MIB and value % MIB == 0:
        return f"`{value}` ({value // MIB} MiB)"
    if value == "":
        return '`""` (see below)'
    return f"`{value!r}`" if isinstance(value, list) else f"`{value}`"


def _flags(command: click.Command) -> dict[str, str]:
    """_flags maps a config key to the `walkit bookie` option that sets it."""
    flags = {}
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            flags[param.name] = " / ".join(f"`{opt}`" for opt in param.opts + param.secondary_opts)
    return flags


def bookie_config() -> str:
    """bookie_config is the table of the bookie's keys and what its docstring says of each."""
    from walkit.bookie import config as module
    from walkit.cli import main

    flags = _flags(main.commands["bookie"])
    fields = {f.name: f for f in dataclasses.fields(module.BookieConfig)}
    missing = sorted(set(module._RULES) - set(fields))
    if missing:
        raise ValueError(f"_RULES names keys BookieConfig lacks: {missing}")
    rows = ["| key | type | default | must be | flag |", "| --- | --- | --- | --- | --- |"]
    for key, (kind, _check, requirement) in module._RULES.items():
        anchor = f'<a id="{key}"></a>'
        rows.append(f"| {anchor}`{key}` | {kind.__name__} | {_default(fields[key])} | {cell(requirement)} "
                    f"| {flags.get(key, '')} |")
    doc = inspect.cleandoc(module.BookieConfig.__doc__)
    summary, _, bullets = doc.partition("\n\n")
    lines = []
    for line in bullets.splitlines():
        if line.startswith("- "):
            lines.append("- " + line[2:])
        else:
            lines.append("  " + line.strip())
    return "\n".join([
        "### Keys", "",
        *rows, "",
        "### What each key does", "",
        "From the docstring of `BookieConfig`: " + escape(summary.split(" is ", 1)[-1]), "",
        "\n".join(lines), "",
    ])


# -- the command line -----------------------------------------------------------------------------

def _option_row(param: click.Parameter, ctx: click.Context) -> str | None:
    if getattr(param, "hidden", False):
        return None
    if isinstance(param, click.Argument) or param.name == "help":
        return None                     # every command has --help; the page says so once
    names = ", ".join(f"`{opt}`" for opt in param.opts + param.secondary_opts)
    record = param.get_help_record(ctx)
    what = record[1] if record else ""
    metavar = ""
    if not (isinstance(param, click.Option) and param.is_flag):
        try:
            metavar = param.make_metavar(ctx)       # click 8.2 and later
        except TypeError:
            metavar = param.make_metavar()          # click 8.1
    return f"| {names} | {cell(metavar)} | {cell(what)} |"


def _usage(command: click.Command, path: str, ctx: click.Context) -> str:
    pieces = command.collect_usage_pieces(ctx)
    return f"{path} {' '.join(pieces)}".strip()


def _command(command: click.Command, path: str, parent: click.Context | None, out: list[str]) -> None:
    ctx = click.Context(command, info_name=path.split(" ")[-1], parent=parent)
    depth = min(2 + path.count(" "), 5)
    out += [f"{'#' * depth} {path}", ""]
    out += ["```text", _usage(command, path, ctx), "```", ""]
    if command.help:
        out += [paragraphs(command.help), ""]
    rows = [row for row in (_option_row(p, ctx) for p in command.get_params(ctx)) if row]
    if rows:
        out += ["| option | value | meaning |", "| --- | --- | --- |", *rows, ""]
    if isinstance(command, click.Group):
        for name in sorted(command.list_commands(ctx)):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                _command(sub, f"{path} {name}", ctx, out)


def cli() -> str:
    """cli is every `walkit` command, depth first, in the order `walkit --help` lists them."""
    from walkit.cli import main

    out: list[str] = []
    _command(main, "walkit", None, out)
    return "\n".join(out)


GENERATORS = {"bookie-config": bookie_config, "cli": cli}
