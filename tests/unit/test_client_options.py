"""Client options that are wrong are refused before the client connects to anything."""

from __future__ import annotations

import pytest

import walkit
from walkit.errors import ConfigError


@pytest.mark.parametrize("value", [-1, -0.5, float("nan"), float("inf"), True, "2", None])
def test_a_bad_speculative_read_timeout_is_a_config_error(tmp_path, value):
    with pytest.raises(ConfigError, match="speculative_read_timeout"):
        walkit.Client(f"sqlite:///{tmp_path}/meta.db", speculative_read_timeout=value)
    assert not (tmp_path / "meta.db").exists()      # refused before the metadata store was opened
