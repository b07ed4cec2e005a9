"""The sweep's picture: throughput of both servers with the crossover marked, and their latencies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

PLAIN_COLOR, SPEC_COLOR = "#1f77b4", "#d62728"


def plot_sweep(doc: dict[str, Any], path: str | Path) -> None:
    levels = [lv for lv in doc["levels"] if lv.get("plain") and lv.get("spec")]
    conc = [lv["concurrency"] for lv in levels]
    fig, (thr, lat) = plt.subplots(1, 2, figsize=(13, 5), dpi=110)

    thr.plot(conc, [lv["plain"]["output_tokens_per_s"] for lv in levels], "o-", color=PLAIN_COLOR, label="plain")
    thr.plot(conc, [lv["spec"]["output_tokens_per_s"] for lv in levels], "s-", color=SPEC_COLOR, label="speculative")
    crossover = doc.get("crossover_concurrency")
    if crossover is not None:
        thr.axvline(crossover, color="gray", linestyle="--")
        thr.annotate(
            f"crossover ~ {crossover:.0f}",
            xy=(crossover, 0.02),
            xycoords=("data", "axes fraction"),
            xytext=(6, 6),
            textcoords="offset points",
            color="dimgray",
        )
    thr.set(title="Output throughput", xlabel="concurrent requests", ylabel="output tokens / s")

    for role, color, marker in (("plain", PLAIN_COLOR, "o"), ("spec", SPEC_COLOR, "s")):
        p50 = [_ms(lv[role].get("tpot_p50_s")) for lv in levels]
        p99 = [_ms(lv[role].get("tpot_p99_s")) for lv in levels]
        name = "plain" if role == "plain" else "speculative"
        lat.plot(conc, p50, marker + "-", color=color, label=f"{name} TPOT p50")
        lat.plot(conc, p99, marker + ":", color=color, alpha=0.6, label=f"{name} TPOT p99")
    lat.set(title="Time per output token", xlabel="concurrent requests", ylabel="ms")

    for ax in (thr, lat):
        if conc and max(conc) / max(1, min(conc)) >= 16:
            ax.set_xscale("log", base=2)
            ax.set_xticks(conc, [str(c) for c in conc])
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    status = "" if doc.get("complete") else f"  (incomplete: {doc.get('failure') or 'stopped'})"
    tau = doc.get("mean_acceptance_length")
    fig.suptitle(
        f"{doc.get('model') or 'model'}: speculative vs plain, max_tokens {doc.get('max_tokens')}"
        + (f", mean acceptance length {tau:.2f}" if tau else "")
        + status
        + (f"\n{doc['note']}" if doc.get("note") else ""),
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else seconds * 1000.0
