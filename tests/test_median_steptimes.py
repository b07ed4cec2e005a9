"""bench/median_steptimes.py: the shipped Llama-2-7B table is the per-point median of its three recorded runs."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest
from load_script import load_script

from specwatch.crossover.reference import load_reference

REPO = Path(__file__).resolve().parent.parent
RUNS = sorted((REPO / "docs" / "reference" / "h200-llama2-7b-lease6").glob("run*.json"))
SHIPPED = REPO / "specwatch" / "data" / "h200-steptimes-llama2-7b-ctx1024.json"


@pytest.fixture(scope="module")
def median_steptimes():
    return load_script("median_steptimes")


def documents() -> list[dict]:
    return [json.loads(path.read_text(encoding="utf-8")) for path in RUNS]


def test_shipped_table_is_the_median_of_the_recorded_runs(median_steptimes, tmp_path):
    assert len(RUNS) == 3
    out = tmp_path / "merged.json"
    assert median_steptimes.main(["--out", str(out), *map(str, RUNS)]) == 0
    merged, shipped = json.loads(out.read_text()), json.loads(SHIPPED.read_text())
    assert merged["runs"][0]["target"] == shipped["runs"][0]["target"]
    assert merged["runs"][0]["draft"] == shipped["runs"][0]["draft"]
    key = "256x3"
    assert merged["runs"][0]["target"][key] == statistics.median(d["runs"][0]["target"][key] for d in documents())
    assert len(merged["provenance"]["runs"]) == 3
    # The merged file loads as a reference table, and its derived speedups follow from the medians.
    run = load_reference(out).runs[0]
    derived = merged["runs"][0]["derived"]["gamma=2,alpha=0.6"]["speedup"]
    assert all(derived[str(b)] == pytest.approx(s, abs=6e-4) for b, s in run.speedup(2, 0.6).items())


def test_runs_of_different_batches_or_variants_are_refused(median_steptimes):
    docs = documents()
    fewer = copy.deepcopy(docs[1])
    del fewer["runs"][0]["draft"]["384"]
    other_variant = copy.deepcopy(docs[2])
    other_variant["provenance"]["variant"] = "gqa"
    with pytest.raises(ValueError) as excinfo:
        median_steptimes.merge([docs[0], fewer, other_variant], "test")
    message = str(excinfo.value)
    assert "run 2: draft differs" in message and "different variants" in message
