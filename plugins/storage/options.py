"""walkit.plugins.storage.options reads a storage backend's tuning options from its URI query.

    files:///var/lib/bookie?journal_max_mb=64&checkpoint_s=30

Each backend declares its options as `Option`s. `split_uri` takes the query off a URI; the
backend merges it with the keyword options given to `from_uri` (keywords win, as in the sqlite
metadata store) and `check_options` converts every value and checks its range, raising
ConfigError with the option, the value and what is expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from walkit.errors import ConfigError


@dataclass(frozen=True)
class Option:
    """Option is one tunable of a backend: its type, default and allowed range."""

    kind: type
    default: float | int
    minimum: float | int = 0
    maximum: float | int | None = None
    exclusive_minimum: bool = True

    def convert(self, scheme: str, name: str, raw: object) -> float | int:
        """convert turns `raw` (a string from the URI or a Python value) into a checked value."""
        try:
            if isinstance(raw, bool):
                raise ValueError
            value = self.kind(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{scheme} storage: {name}={raw!r} is not {_article(self.kind)}") from None
        too_low = value <= self.minimum if self.exclusive_minimum else value < self.minimum
        too_high = self.maximum is not None and value > self.maximum
        if too_low or too_high or value != value:            # value != value: NaN
            relation = ">" if self.exclusive_minimum else ">="
            upper = f" and <= {self.maximum}" if self.maximum is not None else ""
            raise ConfigError(f"{scheme} storage: {name}={raw!r} is out of range; expected {relation} "
                              f"{self.minimum}{upper}")
        return value


def _article(kind: type) -> str:
    """_article names a value type for error messages ("an integer")."""
    return {int: "an integer", float: "a number"}.get(kind, kind.__name__)


def split_uri(uri: str) -> tuple[str, dict[str, str]]:
    """split_uri returns a backend URI without its query, and the query as a dict."""
    parts = urlsplit(uri)
    return uri.split("?", 1)[0], dict(parse_qsl(parts.query, keep_blank_values=True))


def check_options(scheme: str, spec: dict[str, Option], options: dict) -> dict:
    """check_options returns every option of `spec`, converted and checked, from `options` or the default."""
    unknown = sorted(set(options) - set(spec))
    if unknown:
        known = ", ".join(sorted(spec)) or "none"
        raise ConfigError(f"{scheme} storage: unknown option(s) {', '.join(unknown)}; known: {known}")
    return {name: option.convert(scheme, name, options[name]) if name in options else option.default
            for name, option in spec.items()}
