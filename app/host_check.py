"""Which requests the dashboard answers: a Host header must name this machine or an address the
dashboard was started with, so that a DNS rebinding page gets an error and nothing else."""

from __future__ import annotations

# Host names the dashboard answers to besides the address it was started on: a request naming
# any other host (DNS rebinding: a hostile page whose name resolves to 127.0.0.1) gets an error.
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


def host_of(header: str | None) -> str:
    """The host name of a Host header ("name:port", "[v6]:port" or "name"), lower case."""
    host = (header or "").strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(header: str | None, configured: tuple[str | None, ...] = ()) -> bool:
    """Whether a request's Host header names this machine or an address the dashboard was
    configured with (`--server.address`, `--browser.serverAddress`). No header at all (no HTTP
    request: Streamlit's AppTest) names no foreign host."""
    if header is None:
        return True
    host = host_of(header)
    allowed = LOCAL_HOSTS | {host_of(c) for c in configured if c}
    return host in allowed or host.endswith(".localhost")
