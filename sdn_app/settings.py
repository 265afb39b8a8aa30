"""The app's settings: oslo.config options in group [ces_sdn], so that they come from our launcher
(`python -m sdn_app --topo ...` sets them) or, under `ryu-manager`, from a `--config-file`."""

from __future__ import annotations

import functools
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from protocol.dilation import NONE, Dilation
from protocol.http import listen_tls, listen_token
from protocol.tls import Tls
from topologies import Topology, load_topology

from .compat import cfg
from .flows import MeterPolicy

GROUP = "ces_sdn"
cfg.CONF.register_opts(
    [
        cfg.StrOpt("topo", default="campus", help="topology name or file (see topologies/)"),
        cfg.StrOpt("rest", default="127.0.0.1:8080", help="REST API listen address HOST:PORT"),
        cfg.FloatOpt("stats_interval", default=1.0, help="statistics polling interval, seconds"),
        cfg.StrOpt("state", default="", help="job state file (JSON); empty: jobs live in memory"),
        cfg.FloatOpt(
            "burst_s",
            default=MeterPolicy.burst_s,
            help="meter burst as seconds of traffic at the granted rate",
        ),
        cfg.FloatOpt("barrier_timeout", default=5.0, help="seconds to wait for a switch's barrier"),
        cfg.StrOpt(
            "dilation",
            default="",
            help="the emulation's time dilation K@ORIGIN (protocol.dilation): meters at the "
            "host's share of a rate, statistics on the emulated clock",
        ),
        cfg.StrOpt(
            "tls",
            default="",
            help="TLS identity folder (cert.pem, key.pem, ca.pem of `python -m lab certs`): the "
            "REST API over mutual TLS, and OpenFlow over TLS when launched by `python -m sdn_app`",
        ),
        cfg.BoolOpt(
            "insecure",
            default=False,
            help="serve the REST API in plain HTTP beyond loopback (the token in clear)",
        ),
        cfg.StrOpt(
            "token_file",
            default="",
            help="file holding the shared secret the REST API requires (needed beyond loopback)",
        ),
    ],
    group=GROUP,
)


@dataclass(frozen=True)
class Settings:
    topo: Topology
    rest_host: str
    rest_port: int
    stats_interval: float
    state: Path | None
    policy: MeterPolicy
    barrier_timeout_s: float
    dilation: Dilation = NONE
    token: str | None = field(default=None, repr=False)  # never in a log line
    tls: Tls | None = None  # the REST API's identity


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:8080') → (host, port); ValueError with a readable message."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        if not sep or not host:
            raise ValueError
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        raise ValueError(
            f"expected HOST:PORT with an IP address, e.g. 127.0.0.1:8080; got {text!r}"
        ) from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port must be 0-65535, got {number}")
    return host, number


@functools.cache
def settings() -> Settings:
    """The settings from the configuration (read once; the topology is loaded once)."""
    conf = cfg.CONF[GROUP]
    host, port = parse_address(conf.rest)
    if conf.stats_interval <= 0 or conf.burst_s <= 0 or conf.barrier_timeout <= 0:
        raise ValueError("stats_interval, burst_s and barrier_timeout must be > 0")
    dilation = Dilation.parse(conf.dilation)
    return Settings(
        topo=load_topology(conf.topo),
        rest_host=host,
        rest_port=port,
        stats_interval=conf.stats_interval,
        state=Path(conf.state) if conf.state else None,
        policy=MeterPolicy(burst_s=conf.burst_s, dilation=dilation),
        barrier_timeout_s=conf.barrier_timeout,
        dilation=dilation,
        token=listen_token(host, conf.token_file),
        tls=listen_tls(host, conf.tls, conf.insecure, "the SDN app's REST API"),
    )
