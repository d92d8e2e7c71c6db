"""Zeus's `zeusd`: a root daemon that changes GPU settings for unprivileged users over HTTP on a Unix socket.

The probe checks the socket the profile names (`zeusd_socket`) without sending a request: it exists, is a socket,
this process may read and write it, and a daemon accepts connections. Settings go through zeusd's GPU endpoints as
Zeus's own client calls them (zeusd 0.3-0.5: POST /gpu/<index>/set_power_limit {power_limit_mw},
/gpu/<index>/set_gpu_locked_clocks {min_clock_mhz, max_clock_mhz}, /gpu/<index>/reset_gpu_locked_clocks, each with
"block": true; a JWT from ZEUSD_TOKEN is sent as a bearer token where set). <index> is zeusd's NVML index, which is
this process's NVML index where the job sees all GPUs of the node (Zeus makes the same assumption).
Tested against a fake zeusd only (tests/fakes/zeusd.py); never against a real one.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat

from joulebench.device_settings.nvml import DeviceCallError

TOKEN_ENV = "ZEUSD_TOKEN"
TIMEOUT_S = 30.0


def socket_problem(path: str) -> str | None:
    """Why the zeusd socket at `path` cannot be used by this process, or None when it can. Sends nothing."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        return f"the zeusd socket {path} does not exist here ({exc.strerror})"
    if not stat.S_ISSOCK(mode):
        return f"{path} is not a socket"
    if not os.access(path, os.R_OK | os.W_OK):
        return f"this process may not read and write the zeusd socket {path} (mode {stat.filemode(mode)})"
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
    except OSError as exc:
        return f"no zeusd listens on {path} ({exc.strerror or exc})"
    finally:
        probe.close()
    return None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("zeusd", timeout=TIMEOUT_S)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(self._path)


class ZeusdSetter:
    """Set and reset through zeusd; the daemon holds the privilege, this process needs none."""

    route = "zeusd"

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path

    def _post(self, index: int, action: str, **body: int) -> None:
        headers = {"Content-Type": "application/json"}
        if os.environ.get(TOKEN_ENV):
            headers["Authorization"] = f"Bearer {os.environ[TOKEN_ENV]}"
        connection = _UnixConnection(self.socket_path)
        try:
            connection.request("POST", f"/gpu/{index}/{action}", json.dumps({**body, "block": True}), headers)
            response = connection.getresponse()
            text = response.read().decode(errors="replace").strip()
        except OSError as exc:
            raise DeviceCallError(f"zeusd {action} on GPU {index}: {exc}") from exc
        finally:
            connection.close()
        if response.status != 200:
            reason = " ".join(text.split())[:200]
            raise DeviceCallError(f"zeusd {action} on GPU {index}: HTTP {response.status} {reason}")

    def set_power_limit(self, index: int, handle: object, milliwatts: int) -> None:
        self._post(index, "set_power_limit", power_limit_mw=milliwatts)

    def lock_sm_clock(self, index: int, handle: object, mhz: int) -> None:
        self._post(index, "set_gpu_locked_clocks", min_clock_mhz=mhz, max_clock_mhz=mhz)

    def reset_sm_clock(self, index: int, handle: object, prior_range_mhz: object) -> None:
        self._post(index, "reset_gpu_locked_clocks")
