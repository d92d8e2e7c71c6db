"""`--metrics-port`: the sampler's latest readings in Prometheus' text format, for a cluster's Prometheus/Grafana.

    jpwr_energy_joules_total{node, device, uuid, run_id, window}   the device's energy counter (its own zero), J
    jpwr_power_watts{node, device, uuid, run_id, window}           the latest power reading, W: of the
                                                                   instantaneous sensor where the device has
                                                                   one (NVML's on H100), else of its average

One series per accelerator (the disjoint cover a headline sums, so a module and the GPU inside it are not both
counted) and per node; `window` is the window open on this node when scraped (the last begun and not yet ended,
`none` between windows; a log interval is no window). Each sample carries its reading's own time (wall clock, ms),
so a scrape never moves a value in time and the values are the trace's, not averages. Only values the sampler
already holds are served: a scrape costs no sensor read. Bound to 127.0.0.1 unless --metrics-host opens it: the
figures reveal what runs where. A client that sends nothing is dropped after HANDLER_TIMEOUT_S, and closing the
server waits for no client.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from jpwr.channel import is_interval_mark
from jpwr.domains import Signal
from jpwr.windows import accelerator_domains

if TYPE_CHECKING:
    from jpwr.sampler import Sampler

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HANDLER_TIMEOUT_S = 30.0  # longer than Prometheus' scrape timeout (10 s by default)
FAMILIES = (
    ("jpwr_energy_joules_total", "counter", "Accelerator energy counter (the device's own zero), J",
     (Signal.ENERGY_COUNTER,)),
    ("jpwr_power_watts", "gauge", "Accelerator power, latest reading, W", (Signal.POWER_INSTANT, Signal.POWER_AVERAGE)),
)  # per family, the device's sensors in order of preference: the first the device has is served


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def open_window(marks: Iterable[Any]) -> str:
    """The window begun last and not yet ended on this node, or `none` (log intervals are not windows)."""
    opened: list[str] = []
    for mark in marks:
        if is_interval_mark(mark.name):  # a log interval inside the window, not a window
            continue
        if mark.edge == "begin":
            opened.append(mark.name)
        elif mark.name in opened:
            opened.remove(mark.name)
    return opened[-1] if opened else "none"


def exposition(sampler: Sampler) -> str:
    """The text a scrape gets: the latest OK reading of each accelerator's sensors, stamped with its own time."""
    latest, marks, wall_minus_mono = sampler.latest()
    window = open_window(marks)
    lines = []
    for name, kind, help_text, signals in FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for domain in accelerator_domains(sampler.domains):
            own = {s.signal: s for s in sampler.sensors if s.domain_id == domain.id}
            sensor = next((own[signal] for signal in signals if signal in own), None)  # one series per device
            reading = latest.get(sensor.id) if sensor is not None else None
            if reading is None:
                continue
            labels = {"node": sampler.node, "device": domain.id, "uuid": domain.device_uuid or "",
                      "run_id": sampler.run_id, "window": window}
            text = ",".join(f'{k}="{_label(str(v))}"' for k, v in labels.items())
            stamp = "" if wall_minus_mono is None else f" {(reading.t_ns + wall_minus_mono) // 1_000_000}"
            lines.append(f"{name}{{{text}}} {reading.value!r}{stamp}")
    return "\n".join(lines) + "\n"


class _Server(ThreadingHTTPServer):
    """Closing does not wait for the clients' threads: an idle connection must not keep jpwr from exiting."""

    block_on_close = False
    daemon_threads = True


class MetricsServer:
    """An HTTP server on its own thread answering GET /metrics from the sampler's memory."""

    def __init__(self, sampler: Sampler, host: str, port: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            timeout = HANDLER_TIMEOUT_S  # a client that connects and sends nothing is dropped

            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics")
                    return
                body = exposition(sampler).encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:  # a scrape every few seconds must not fill stderr
                pass

        self.httpd = _Server((host, port), Handler)
        self.address = f"http://{host}:{self.httpd.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="jpwr-metrics", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
