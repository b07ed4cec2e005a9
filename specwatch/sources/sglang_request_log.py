"""SGLang's per-request metrics files -> EngineSample: true per-route acceptance on a shared server.

SGLang (0.5.23, `srt/observability/request_metrics_exporter.py`, `FileRequestMetricsExporter`) started with
`--export-metrics-to-file --export-metrics-to-file-dir D` appends one JSON line per finished request to
`D/sglang-request-metrics-YYYYMMDD_HH.log` (a new file each hour, local time; `json.dump` + "\\n" + flush):

    {"request_parameters": "<json.dumps of the request's GenerateReqInput fields that are not None>",
     <the response's meta_info: "id", "finish_reason", "prompt_tokens", "completion_tokens", ...>}

`meta_info` carries the request's speculative counts when it verified at least once
(`TokenizerManager._calculate_spec_decoding_metrics`, `srt/managers/tokenizer_manager.py`):
`spec_verify_ct` (verify steps), `spec_num_correct_drafts` (accepted draft tokens, bonus excluded),
`spec_num_proposed_drafts` (= spec_verify_ct x (speculative_num_draft_tokens - 1)) and
`spec_correct_drafts_histogram` (index i: steps that accepted exactly i drafts; `Req.update_spec_correct_drafts_
histogram`, `srt/managers/schedule_batch.py`). The request's custom labels (`GenerateReqInput.custom_labels`, from
the `--tokenizer-metrics-custom-labels-header` header, default `x-custom-labels`, keys limited to
`--tokenizer-metrics-allowed-custom-labels`; `srt/entrypoints/openai/serving_base.py`) are inside
`request_parameters`, and a route's `match` selects on them.

Prompt text: unless SGLang runs with `--log-requests --log-requests-level 0|1` (which skips `text` and
`input_ids`), `request_parameters` holds the prompt. It is never parsed: `custom_labels` is found by its key,
which json.dumps writes as `"custom_labels": ` and which inside any string value would be escaped (`\\"`), and
only that value is decoded. Nothing of a record but its counts and labels is kept.

The files are tailed: a partial last line waits for its end, a new hour's file is read once the previous one
is drained, a truncated or replaced file is read again from its start. On first sight the source starts at
the end of the newest file (like `tail -f`), so a daemon restart does not count requests twice; the counts are
cumulative from then on, exactly like engine counters, and go through the same tracker.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import unquote, urlsplit

from specwatch.config import RouteConfig
from specwatch.snapshot import EngineCounters, EngineSample
from specwatch.sources.base import NoData, SourceError
from specwatch.engine_kinds import REQUEST_LOG

FILE_RE = re.compile(r"^sglang-request-metrics-(\d{8}_\d{2})\.log$")
_LABELS_KEY = '"custom_labels": '
MAX_READ_BYTES = 64 << 20  # per cycle: a backlog is read over several cycles, memory stays bounded


@dataclass(frozen=True)
class RequestRecord:
    """The speculative counts of one finished request and its custom labels."""

    labels: Mapping[str, str]
    verify_steps: int
    accepted: int
    proposed: int
    histogram: tuple[int, ...]  # index i: verify steps that accepted exactly i draft tokens


def custom_labels(request_parameters: str) -> dict[str, str]:
    """The `custom_labels` of a request_parameters string, without parsing anything else of it."""
    at = request_parameters.find(_LABELS_KEY)
    if at < 0 or (at > 0 and request_parameters[at - 1] not in "{ "):
        return {}
    try:
        value, _ = json.JSONDecoder().raw_decode(request_parameters, at + len(_LABELS_KEY))
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def parse_record(line: str) -> RequestRecord | None:
    """One line of the file -> its RequestRecord; None for a request that never verified (no spec fields).

    Raises ValueError for a line that is not a JSON object of SGLang's form."""
    raw = json.loads(line)
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    if "spec_verify_ct" not in raw:
        return None
    params = raw.get("request_parameters")
    labels = custom_labels(params) if isinstance(params, str) else {}
    hist = raw.get("spec_correct_drafts_histogram") or []
    values = (
        raw["spec_verify_ct"],
        raw.get("spec_num_correct_drafts", 0),
        raw.get("spec_num_proposed_drafts", 0),
        *hist,
    )
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError("spec counts must be non-negative integers")
    return RequestRecord(
        labels,
        raw["spec_verify_ct"],
        raw.get("spec_num_correct_drafts", 0),
        raw.get("spec_num_proposed_drafts", 0),
        tuple(hist),
    )


class DirectoryTail:
    """New complete lines of SGLang's hourly files in one directory, in order, across rotations."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.name: str | None = None  # the file being read
        self.inode: int | None = None
        self.offset = 0
        self.partial = b""
        self.dropped_partials = 0  # unfinished last lines of files that were left for a newer one

    def _files(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            raise SourceError("connection", f"cannot list {self.directory}: {exc.strerror or exc}") from None
        return sorted(n for n in names if FILE_RE.match(n))

    def read_lines(self) -> list[str]:
        files = self._files()
        if self.name is None:
            if not files:
                return []
            self._open(files[-1], at_end=True)
        lines: list[str] = []
        budget = MAX_READ_BYTES
        while True:
            budget -= self._drain(lines, budget)
            newer = [n for n in files if self.name is None or n > self.name]
            if budget <= 0 or not newer:
                return lines
            if self.partial:  # SGLang writes whole lines; one left unfinished in an older file never ends
                self.dropped_partials += 1
            self._open(newer[0], at_end=False)

    def _open(self, name: str, at_end: bool) -> None:
        path = os.path.join(self.directory, name)
        try:
            st = os.stat(path)
        except OSError:
            st = None
        self.name, self.partial = name, b""
        self.inode = st.st_ino if st else None
        self.offset = st.st_size if (st and at_end) else 0

    def _drain(self, lines: list[str], budget: int) -> int:
        """Read the current file from the offset; append its complete lines. Returns the bytes read."""
        assert self.name is not None
        path = os.path.join(self.directory, self.name)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.inode or st.st_size < self.offset:  # replaced or truncated: from its start
                    self.inode, self.offset, self.partial = st.st_ino, 0, b""
                f.seek(self.offset)
                data = f.read(max(0, budget))
        except FileNotFoundError:
            return 0  # removed (e.g. by log cleanup) before it was read: the next file follows
        except OSError as exc:
            raise SourceError("connection", f"cannot read {path}: {exc.strerror or exc}") from None
        read = len(data)
        self.offset += read
        *complete, self.partial = (self.partial + data).split(b"\n")
        lines.extend(line.decode("utf-8", "replace") for line in complete if line.strip())
        return read


def directory_of(url: str) -> str:
    """`file:///var/log/sglang` -> `/var/log/sglang`."""
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or not parts.path:
        raise ValueError(f"not a file:// URL of a directory: {url!r}")
    return unquote(parts.path)


class SGLangRequestLogSource:
    """A route's counts from SGLang's per-request files: the requests whose custom labels match `route.match`."""

    def __init__(self, route: RouteConfig) -> None:
        self.route = route
        self.tail = DirectoryTail(directory_of(route.url))
        self.match = dict(route.match)
        self.steps = self.accepted = self.proposed = 0
        self.per_pos: list[int] = []
        self.k: int | None = None
        self.bad_lines = 0
        self.seen_any = False

    def sample(self, now: float) -> EngineSample:
        for line in self.tail.read_lines():
            try:
                record = parse_record(line)
            except (ValueError, KeyError):
                self.bad_lines += 1
                continue
            self.seen_any = True
            if record is None or any(record.labels.get(k) != v for k, v in self.match.items()):
                continue
            self._add(record)
        if self.tail.name is None and not self.seen_any:
            raise NoData(f"no sglang-request-metrics-*.log in {self.tail.directory} yet")
        return EngineSample(
            ts=now,
            engine_kind=REQUEST_LOG,
            acceptance_source="counter",
            model_name=self.match.get("model_name", ""),
            speculation_enabled=True,
            num_speculative_tokens=self.k,
            engines=(
                EngineCounters(
                    engine="0",
                    drafts=float(self.steps),
                    draft_tokens=float(self.proposed),
                    accepted_tokens=float(self.accepted),
                    accepted_per_pos=tuple(float(x) for x in self.per_pos),
                ),
            ),
        )

    def _add(self, r: RequestRecord) -> None:
        self.steps += r.verify_steps
        self.accepted += r.accepted
        self.proposed += r.proposed
        if r.verify_steps and r.proposed % r.verify_steps == 0:
            self.k = r.proposed // r.verify_steps  # speculative_num_draft_tokens - 1
        positions = max(len(r.histogram) - 1, self.k or 0)
        while len(self.per_pos) < positions:
            self.per_pos.append(0)
        for j in range(len(self.per_pos)):  # position j+1 accepted: steps that accepted more than j drafts
            self.per_pos[j] += sum(r.histogram[j + 1 :])

    def close(self) -> None:
        pass
