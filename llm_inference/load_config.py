"""The resolved configuration of `python -m llm_inference load`: model, arrivals, rows, SLOs, run control.

Resolution needs no device, so `validate-load` runs on a login node; checks are in validation.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from joulebench.arguments import COUNT, COUNT_OR_ZERO, MILLISECONDS, PORT, SECONDS, SEED, SIZE, Number, SameMeaning
from joulebench.lifecycle import default_out_dir, new_run_id
from jpwr import ValidationError
from llm_inference.arrivals import PROCESSES, parse_rate, parse_rates
from llm_inference.config import add_control_arguments, add_model_arguments
from llm_inference.http_client import APIS, parse_url
from llm_inference.tasks import TASKS

DEFAULT_CONCURRENCY = 64
ADMIT_DIVISOR = 16  # --admit-divisor's default: under a backlog, admit once 1/16 of the rows are free
WARMUP_ARRIVAL_S = 10.0  # finite rates: warm-up requests arrive for this long (GPU) before the counted ones


def counted_requests(requests: int | None, rate: float, window_s: float) -> int:
    """A finite rate's counted requests: --requests, else enough arrivals to span the window."""
    return requests or math.ceil(rate * window_s) + 1


def rate_label(rate: float) -> str:
    """How a rate names its record: `max`, or the number as given (`0.5`, `4`)."""
    return "max" if math.isinf(rate) else f"{rate:g}"


@dataclasses.dataclass(frozen=True)
class ServerTarget:
    """An OpenAI-compatible server: at `url`, or started from `command` (a template, llm_inference/server.py)."""

    url: str | None
    command: str | None
    port: int | None  # of a started server (None: a free one)
    version_command: str | None
    ready_timeout_s: float
    devices: str | None  # the server's devices (CUDA_VISIBLE_DEVICES form): given to a started server, metered
    api: str  # chat | completions
    served_model: str | None  # the requests' "model" (None: the checkpoint, else the preset)
    engine_name: str | None  # the engine column (None: the command's program, or "external")
    request_timeout_s: float
    retries: int
    request_extra: dict[str, Any]

    @property
    def engine(self) -> str:
        """The engine column: --engine-name, else the started program (the module of `python -m MODULE`, its top
        package), else "external"."""
        if self.engine_name:
            return self.engine_name
        words = self.command.split() if self.command else []
        if not words:
            return "external"
        if "-m" in words[:-1] and ("python" in words[0] or words[0] == "{python}"):
            return words[words.index("-m") + 1].split(".")[0]
        return words[0].rsplit("/", 1)[-1]


def _json_object(text: str) -> dict[str, Any]:
    """An argparse `type` for --request-extra: a JSON object merged into every request body."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object (expected e.g. '{{\"ignore_eos\": true}}')")
    return value


@dataclasses.dataclass(frozen=True)
class LoadConfig:
    """Everything one `load` invocation uses; each rate's run record stores it with its own rate."""

    preset: str
    checkpoint: str | None
    precision: str
    task: str
    rates: tuple[float, ...]  # requests/s; inf = `max` (all queued at the start)
    arrivals: str  # poisson or constant
    trace: str | None  # JSONL replay instead of drawn arrivals and lengths
    max_concurrency: int
    requests: int | None  # counted requests per rate; None: enough for the window
    warmup_requests: int | None  # None: the rows' count at `max`, WARMUP_ARRIVAL_S of arrivals otherwise
    output_length: int | None
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    steady_seconds: float | None
    idle_baseline: bool
    exit_duration_mins: float | None
    device: str
    seed: int
    out_dir: str
    run_id: str
    energy_methods: str | None
    decode_tuning: str = "auto"  # the engine's compiled decode variant (llm_inference.config.DECODE_TUNING_CHOICES)
    server: ServerTarget | None = None  # an OpenAI-compatible server instead of the in-process engine
    log_to: tuple[str, ...] = ()  # --log-to: tools the record's window figures go to (joulebench.exports)
    tensor_parallel: int = 1  # ranks the in-process engine is split over (llm_inference.config --tensor-parallel)
    admit_divisor: int = ADMIT_DIVISOR  # the engine admits under a backlog once rows // this are free (scheduler.py)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["rates"] = [rate_label(r) for r in self.rates]
        return data


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `load` and `validate-load`."""
    add_model_arguments(parser, engines=False)
    w = parser.add_argument_group("load")
    w.add_argument("--task", default="chat", choices=list(TASKS), help="input and output length distributions")
    keep = "one: --rates for a sweep (e.g. 1,2,max), or --rate for one rate"
    w.add_argument("--rate", type=parse_rate, action=SameMeaning, same_as=("--rates",), keep=keep,
                   help="requests/s, or max: every request queued at the start")
    w.add_argument("--rates", type=parse_rates, action=SameMeaning, same_as=("--rate",), keep=keep,
                   help="sweep, e.g. 1,2,4,8,max (one run record per rate)")
    w.add_argument("--arrivals", choices=PROCESSES, default="poisson", help="arrival process of finite rates")
    w.add_argument("--trace", help="replay this JSONL trace (arrival_s, input_tokens | prompt_ids | prompt, "
                                   "output_tokens per line) instead of --rate")
    w.add_argument("--max-concurrency", type=SIZE, default=DEFAULT_CONCURRENCY,
                   help="rows: requests decoded together at most (a server: requests in flight at most)")
    w.add_argument("--admit-divisor", type=SIZE, default=ADMIT_DIVISOR, excludes=("--url", "--server-command"),
                   help="the in-process engine's prefill/decode interleave: under a backlog, waiting requests are "
                        "prefilled once 1/N of the rows are free (at least one row; N >= the rows: as soon as one is "
                        "free). Larger: more, smaller prefill steps and fewer empty rows")
    w.add_argument("--requests", type=COUNT, excludes=("--trace",),
                   help="counted requests per rate (default: enough for the window; a --trace's are its own)")
    w.add_argument("--warmup-requests", type=COUNT_OR_ZERO,
                   help=f"requests before the counted ones (default: the rows at max, {WARMUP_ARRIVAL_S:g} s of "
                        "arrivals at a finite rate; 0 = none)")
    w.add_argument("--output-length", type=SIZE, excludes=("--trace",),
                   help="force this many new tokens per request (a --trace's are its own)")
    w.add_argument("--slo-ttft-ms", type=MILLISECONDS, help="time-to-first-token objective for goodput")
    w.add_argument("--slo-tpot-ms", type=MILLISECONDS, help="time-per-output-token objective for goodput")
    w.add_argument("--seed", type=SEED, default=1234, help="seed of the arrivals and lengths")
    add_control_arguments(parser, "the load window lasts at least this long", "runs/llm_inference/<run-id>")
    h = parser.add_argument_group("server (an OpenAI-compatible server instead of the in-process engine)")
    where = h.add_mutually_exclusive_group()
    where.add_argument("--url", type=parse_url, help="a running server's base URL, e.g. http://127.0.0.1:8000")
    where.add_argument("--server-command",
                       help="start this server, a template with {model} {host} {port} {concurrency} {devices} "
                            "{python}, e.g. 'vllm serve {model} --host {host} --port {port} --max-num-seqs "
                            "{concurrency}'")
    h.add_argument("--server-port", type=PORT, help="port of the started server (default: free)")
    h.add_argument("--server-version-command", help="prints the server's version (first line recorded)")
    h.add_argument("--server-ready-timeout", type=SECONDS, default=600.0, help="seconds to wait for readiness")
    h.add_argument("--server-devices", help="the server's devices (CUDA_VISIBLE_DEVICES form): given to a started "
                                            "server and metered; with --url, energy needs them")
    h.add_argument("--api", choices=list(APIS), default="chat",
                   help="/v1/chat/completions or /v1/completions")
    h.add_argument("--served-model", help="the requests' model name (default: --checkpoint, else the preset)")
    h.add_argument("--engine-name", help="the engine column (default: the command's program, or external)")
    h.add_argument("--request-timeout", type=SECONDS, default=600.0, help="seconds for one whole request")
    h.add_argument("--retries", type=Number(int, 0, 100), default=0,
                   help="new attempts of a request whose connection could not be made (nothing was sent; 0 = none)")
    h.add_argument("--request-extra", type=_json_object, default={},
                   help='JSON object merged into every request, e.g. \'{"ignore_eos": true}\' (vLLM, SGLang)')


def resolve_load(args: argparse.Namespace) -> LoadConfig:
    """--rates or --rate (never both: SameMeaning); a trace has no rate (its arrivals are its own)."""
    if args.objective is not None:
        raise ValidationError(f"--objective {args.objective} ranks the static engine's decode variants per batch shape "
                              "(`run`); `load` runs the continuous engine's default variant or a server target, which "
                              "choose nothing", "leave --objective out; pin a variant with --decode-tuning")
    rates = args.rates or ((args.rate,) if args.rate is not None else ())
    run_id = args.run_id or new_run_id("load", Path(args.checkpoint).name if args.checkpoint else args.preset)
    return LoadConfig(
        preset=args.preset, checkpoint=args.checkpoint, precision=args.precision, task=args.task, rates=tuple(rates),
        arrivals=args.arrivals, trace=args.trace, max_concurrency=args.max_concurrency, requests=args.requests,
        warmup_requests=args.warmup_requests, output_length=args.output_length, slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms, steady_seconds=args.steady_seconds, idle_baseline=args.idle_baseline,
        exit_duration_mins=args.exit_duration_mins, device=args.device, seed=args.seed,
        out_dir=args.out_dir or default_out_dir("llm_inference", run_id), run_id=run_id,
        energy_methods=args.energy_methods, decode_tuning=args.decode_tuning, server=_server(args),
        log_to=args.log_to, tensor_parallel=args.tensor_parallel, admit_divisor=args.admit_divisor)


def _server(args: argparse.Namespace) -> ServerTarget | None:
    if args.url is None and args.server_command is None:
        return None
    return ServerTarget(
        url=args.url, command=args.server_command, port=args.server_port,
        version_command=args.server_version_command, ready_timeout_s=args.server_ready_timeout,
        devices=args.server_devices, api=args.api, served_model=args.served_model, engine_name=args.engine_name,
        request_timeout_s=args.request_timeout, retries=args.retries, request_extra=args.request_extra)
