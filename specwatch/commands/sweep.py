"""`specwatch sweep --plain URL --spec URL`: measure the crossover between two otherwise identical servers."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import urlsplit

from specwatch.config import DEFAULT_HTTP_CLIENT, load_http_client_config
from specwatch.offline.sweep import BUILTIN_PROMPTS, DEFAULT_CONCURRENCY, SweepSettings, load_prompts, run_sweep


def _levels(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of concurrency levels: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1: {text!r}")
    return tuple(sorted(set(values)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plain", required=True, metavar="URL", help="server without speculation")
    parser.add_argument("--spec", required=True, metavar="URL", help="the same server with speculation")
    parser.add_argument(
        "--concurrency",
        type=_levels,
        default=DEFAULT_CONCURRENCY,
        metavar="C1,C2,...",
        help="levels (default %s)" % ",".join(map(str, DEFAULT_CONCURRENCY)),
    )
    parser.add_argument(
        "--prompts",
        metavar="JSONL",
        help='prompt file, one {"prompt": ...} or {"messages": [...]} a line (default: a built-in chat/code/math mix)',
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (default 128)")
    parser.add_argument(
        "--requests-per-client", type=int, default=3, help="requests each concurrent client sends per level (default 3)"
    )
    parser.add_argument(
        "--http.config.file",
        dest="http_config_file",
        default="",
        metavar="FILE",
        help="YAML with authorization or basic_auth, tls_config and headers for both servers, as a route's keys "
        "(e.g. the bearer token of a vLLM started with --api-key)",
    )
    parser.add_argument("--model", default="", help="model name to request (default: each server's first model)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request timeout in seconds")
    parser.add_argument("--output", default="crossover.json", help="result file (default crossover.json)")
    parser.add_argument("--plot", default="", help="PNG plot (default: the output name with .png)")
    parser.add_argument(
        "--note", default="", help="free text kept in the result file and the plot (e.g. the GPU and engine flags)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    # matplotlib (the `plot` extra) is imported before measuring, so a node without it learns so at once.
    from specwatch.offline.plot import plot_sweep

    try:
        prompts = load_prompts(args.prompts) if args.prompts else list(BUILTIN_PROMPTS)
        http = load_http_client_config(args.http_config_file) if args.http_config_file else DEFAULT_HTTP_CLIENT
        for flag, url in (("--plain", args.plain), ("--spec", args.spec)):
            if "@" in urlsplit(url).netloc:  # the message leaves the URL out: it holds a secret
                raise ValueError(f"{flag}: credentials in the URL are refused; use --http.config.file")
    except ValueError as exc:
        print(f"specwatch sweep: {exc}", file=sys.stderr)
        return 2
    if args.max_tokens < 2 or args.requests_per_client < 1:
        print("specwatch sweep: --max-tokens must be >= 2 and --requests-per-client >= 1", file=sys.stderr)
        return 2
    settings = SweepSettings(
        plain_url=args.plain,
        spec_url=args.spec,
        concurrency=args.concurrency,
        prompts=prompts,
        prompts_source=args.prompts or "builtin",
        max_tokens=args.max_tokens,
        requests_per_client=args.requests_per_client,
        model=args.model,
        timeout_s=args.timeout,
        note=args.note,
        http=http,
    )
    plot_path = args.plot or (args.output[:-5] if args.output.endswith(".json") else args.output) + ".png"
    if args.quiet:
        outcome = run_sweep(settings, args.output)
    else:
        outcome = _with_progress(settings, args.output)

    doc = outcome.document
    if doc["levels"]:
        plot_sweep(doc, plot_path)
    _print_summary(doc)
    print(f"wrote {args.output}" + (f" and {plot_path}" if doc["levels"] else ""))
    if outcome.failure:
        print(
            f"specwatch sweep: stopped: {outcome.failure}; kept {len(doc['levels'])} measured level(s)", file=sys.stderr
        )
        return 130 if outcome.interrupted else 1
    return 0


def _with_progress(settings: SweepSettings, output: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as progress:
        overall = progress.add_task("levels", total=len(settings.concurrency) * 2)
        current: dict[str, Any] = {"label": None, "task": None}

        def on_progress(label: str, done: int, total: int) -> None:
            if label != current["label"]:
                if current["task"] is not None:  # the previous server stopped early (it failed)
                    progress.remove_task(current["task"])
                current["label"], current["task"] = label, progress.add_task(label, total=total)
            progress.update(current["task"], completed=done)
            if done >= total:
                progress.remove_task(current["task"])
                progress.advance(overall)
                current["label"], current["task"] = None, None

        return run_sweep(settings, output, on_progress)


def _print_summary(doc: dict) -> None:
    if not doc["levels"]:
        return
    print(f"{'conc':>5} {'plain tok/s':>12} {'spec tok/s':>11} {'speedup':>8} {'accept':>7}")
    for lv in doc["levels"]:
        acc = lv["spec"].get("acceptance_ratio")
        print(
            f"{lv['concurrency']:>5} {lv['plain']['output_tokens_per_s']:>12.1f} "
            f"{lv['spec']['output_tokens_per_s']:>11.1f} {lv['speedup'] or 0:>8.3f} "
            f"{'' if acc is None else f'{acc:.3f}':>7}"
        )
    bstar = doc.get("crossover_concurrency")
    print(
        "crossover: "
        + (f"~{bstar:.1f} concurrent requests" if bstar is not None else "none within the measured levels")
    )
