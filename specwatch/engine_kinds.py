"""The engine kinds a route's `engine:` may name.

A leaf module: config.py checks `engine:` against ENGINE_KINDS, and sources/engines.py keys its registry
(`ENGINES`, one entry per name in SCRAPED) by the same names; tests/test_engine_kinds.py ties the two.
"""

from __future__ import annotations

SCRAPED = ("vllm", "sglang", "trtllm", "llamacpp")  # read from /metrics, one source module each under sources/
AUTO = "auto"  # one of SCRAPED, detected from the first exposition and then kept
REQUEST_LOG = "sglang_request_log"  # SGLang's per-request files, read by sources/sglang_request_log.py
ENGINE_KINDS = (*SCRAPED, AUTO, REQUEST_LOG)
