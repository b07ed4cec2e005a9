"""The engine kinds are named once (engine_kinds.py): the source registry and the config check use them."""

from __future__ import annotations

import pytest

from specwatch.config import ConfigError, parse_config
from specwatch import engine_kinds as kinds
from specwatch.sources.engines import ENGINES


def test_the_registry_has_one_entry_per_scraped_kind():
    assert tuple(ENGINES) == kinds.SCRAPED


def test_an_unknown_engine_is_refused_with_every_kind_named():
    with pytest.raises(ConfigError) as raised:
        parse_config({"routes": [{"name": "chat", "url": "http://127.0.0.1:8000/metrics", "engine": "tgi"}]})
    assert f"routes[0].engine: must be one of {', '.join(kinds.ENGINE_KINDS)}, got 'tgi'" in str(raised.value)
