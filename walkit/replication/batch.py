"""walkit.replication.batch is walkit.core.batch under its earlier name (adapters read log entries with it)."""

from walkit.core.batch import *  # noqa: F401,F403 - the same module, under the name adapters import
from walkit.core.batch import __all__  # noqa: F401
