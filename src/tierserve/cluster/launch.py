"""``tierserve serve --replicas N``: start (or join) Ray, deploy the Serve application, serve
until SIGINT/SIGTERM, tear down.

The application has three deployments: ``Ingress`` (HTTP, api/), ``Engine`` (N replicas, each an
AsyncEngine; the custom request router), and ``Board`` (the fleet board). ``--max-replicas M``
lets the class-aware autoscaler move the engine count between N and M.

A local Ray (no ``--ray-address``) runs on loopback in a fresh temp dir, without the dashboard,
and is shut down on exit.

Shutdown (SIGTERM or SIGINT): Serve's graceful shutdown, bounded by the grace period, then
Ray's, then the temp dir goes. Ray's own processes share the server's process group, so a
signal sent to the group (systemd's, ``kill -- -PGID``) reaches them too and Serve's controller
dies first: ``serve.shutdown()`` would then wait 30 s for it, and Ray's raylet, shutting down
meanwhile, would end this process before its cleanup (a temp dir left behind). So Serve's
shutdown runs on a helper thread, skipped or abandoned as soon as any of Ray's processes has
exited, and Ray is stopped at once after it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from tierserve.api.settings import ServerSettings
from tierserve.cluster.autoscale import ScaleConfig
from tierserve.cluster.signals import WINDOW_S
from tierserve.engine.args import EngineArgs
from tierserve.routing import ROUTER_NAMES

log = logging.getLogger("tierserve.cluster")

APP_NAME = "tierserve"
SHUTDOWN_POLL_S = 0.2  # how often draining replicas (and the shutdown here) look again


@dataclass(frozen=True)
class ClusterOptions:
    replicas: int = 2
    max_replicas: int | None = None  # autoscale the engine between replicas and max_replicas
    ray_address: str | None = None  # join this cluster instead of starting a local Ray
    router: str = "priority-aware"
    # Prefix affinity's load margin in tokens (None: RoutingConfig's default, shared with the
    # simulator). Queued tokens cost far more time on a CPU replica than on a GPU one.
    prefix_margin_tokens: int | None = None
    replica_cpus: float = 1.0  # Ray CPUs per engine replica (fractions allowed)
    ingress_replicas: int = 1
    stats_period_s: float = 0.2  # record_routing_stats period
    report_period_s: float = 0.25  # replica -> fleet board, and ingress <- board
    health_check_period_s: float = 2.0
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    ingress_queue: bool = False  # hold requests at the ingress until a seat is free
    signal_window_s: float = WINDOW_S  # the replicas' autoscaling signals' window (signals.py)

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise ValueError(
                f"--max-replicas ({self.max_replicas}) must be >= --replicas ({self.replicas})"
            )
        if self.router not in ROUTER_NAMES:
            raise ValueError(
                f"unknown router {self.router!r}; choose one of {', '.join(ROUTER_NAMES)}"
            )
        if self.prefix_margin_tokens is not None and self.prefix_margin_tokens < 0:
            raise ValueError(
                f"--prefix-margin-tokens must be >= 0, got {self.prefix_margin_tokens}"
            )
        if self.replica_cpus <= 0 or self.ingress_replicas < 1:
            raise ValueError("replica_cpus must be positive and ingress_replicas >= 1")
        if self.signal_window_s <= 0:
            raise ValueError(f"signal_window_s must be positive, got {self.signal_window_s}")


def cluster_options(opts: dict) -> ClusterOptions | None:
    """The cluster settings among `tierserve serve`'s merged options; None: single process."""
    if opts.get("replicas") is None and opts.get("ray_address") is None:
        return None
    kw = {"replicas": 1 if opts.get("replicas") is None else opts["replicas"]}
    for key in ("max_replicas", "ray_address", "router", "prefix_margin_tokens", "ingress_queue"):
        if opts.get(key) is not None:
            kw[key] = opts[key]
    return ClusterOptions(**kw)


def _scaling(opts: ClusterOptions) -> dict:
    if opts.max_replicas is None or opts.max_replicas == opts.replicas:
        return {"num_replicas": opts.replicas}
    from ray.serve.config import AutoscalingConfig, AutoscalingPolicy

    from tierserve.cluster.autoscale import ClassAutoscalingPolicy

    policy = AutoscalingPolicy(
        policy_function=ClassAutoscalingPolicy, policy_kwargs=dataclasses.asdict(opts.scale)
    )
    return {
        "autoscaling_config": AutoscalingConfig(
            min_replicas=opts.replicas,
            initial_replicas=opts.replicas,
            max_replicas=opts.max_replicas,
            look_back_period_s=15.0,
            upscale_delay_s=5.0,
            downscale_delay_s=120.0,
            policy=policy,
        )
    }


def wants_gpus(args: EngineArgs) -> bool:
    """Whether the engine replicas run on CUDA (`--device`, else whether this host has it)."""
    if args.device is not None:
        return args.device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def engine_placement(args: EngineArgs, opts: ClusterOptions) -> dict:
    """The engine deployment's resources. With `--tensor-parallel-size` N each replica is one
    engine of N processes on one node: a placement group of one bundle (STRICT_PACK) holding
    N times a replica's CPUs and, on CUDA, N GPUs, all of which the replica's actor takes (its
    worker processes inherit them: Ray makes the N GPUs visible to it)."""
    tp = args.tensor_parallel_size
    if tp == 1:
        return {"ray_actor_options": {"num_cpus": opts.replica_cpus}}
    actor = {"num_cpus": opts.replica_cpus * tp}
    bundle = {"CPU": opts.replica_cpus * tp}
    if wants_gpus(args):
        actor["num_gpus"] = bundle["GPU"] = tp
    return {
        "ray_actor_options": actor,
        "placement_group_bundles": [bundle],
        "placement_group_strategy": "STRICT_PACK",
    }


def build_app(args: EngineArgs, settings: ServerSettings, opts: ClusterOptions):
    """The bound Serve application (Ingress -> Engine, both -> Board)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from tierserve.cluster.board import Board
    from tierserve.cluster.engine_replica import EngineReplica
    from tierserve.cluster.ingress import Ingress
    from tierserve.cluster.router import TierRequestRouter

    board = serve.deployment(Board).options(
        name="Board", num_replicas=1, ray_actor_options={"num_cpus": 0}
    )
    router_kw = {"router": opts.router, "hold_s": 2 * opts.stats_period_s}
    if opts.prefix_margin_tokens is not None:
        router_kw["prefix_margin_tokens"] = opts.prefix_margin_tokens
    router = RequestRouterConfig(
        request_router_class=TierRequestRouter,
        request_router_kwargs=router_kw,
        request_routing_stats_period_s=opts.stats_period_s,
        request_routing_stats_timeout_s=5.0,
    )
    engine = serve.deployment(EngineReplica).options(
        name="Engine",
        max_ongoing_requests=100_000,  # our admission control and scheduler do the limiting
        request_router_config=router,
        health_check_period_s=opts.health_check_period_s,
        health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=settings.shutdown_grace_s,
        graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S,
        **_scaling(opts),
        **engine_placement(args, opts),
    )
    ingress = serve.deployment(Ingress).options(
        name="Ingress",
        num_replicas=opts.ingress_replicas,
        max_ongoing_requests=100_000,
        ray_actor_options={"num_cpus": 0},
        graceful_shutdown_timeout_s=settings.shutdown_grace_s,
        graceful_shutdown_wait_loop_s=SHUTDOWN_POLL_S,
    )
    b = board.bind()
    threads = max(1, math.floor(opts.replica_cpus))
    if args.tensor_parallel_size > 1 and args.cpu_threads is None:  # per rank: one share
        args = dataclasses.replace(args, cpu_threads=threads * args.tensor_parallel_size)
    from tierserve.api.tenancy import tenant_registry

    tenants = tuple(tenant_registry(settings).tenants)  # the metrics' tenant labels
    model_name = settings.served_model_names[0]
    e = engine.bind(
        args, b, opts.report_period_s, threads, model_name, tenants, opts.signal_window_s
    )
    return ingress.bind(
        e, b, args, settings, opts.ingress_replicas, opts.report_period_s, opts.ingress_queue
    )


def start_ray(
    opts: ClusterOptions, temp_dir: str | None = None, tp: int = 1, **ray_kw
) -> str | None:
    """Join `opts.ray_address`, or start a local Ray on loopback in a new temp dir (returned,
    for the caller to remove after ``ray.shutdown()``); `tp`: processes per engine replica."""
    import ray

    if opts.ray_address:
        ray.init(address=opts.ray_address, **ray_kw)
        return None
    temp_dir = temp_dir or tempfile.mkdtemp(prefix="tsray-")
    # Logical CPUs: enough for every replica at its share, even on a small machine (the
    # replicas then share the cores, as the single-process engine and its clients do).
    need = opts.ingress_replicas + (opts.max_replicas or opts.replicas) * opts.replica_cpus * tp
    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, math.ceil(need)),
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp_dir,
        **ray_kw,
    )
    return temp_dir


def deploy(args: EngineArgs, settings: ServerSettings, opts: ClusterOptions) -> None:
    """Start Serve's HTTP proxy on settings.host:port and run the application (blocks until
    every deployment is healthy)."""
    from ray import serve

    # Serve's per-call access log would log every board report; our own loggers still log.
    logs = {"log_level": settings.log_level.upper(), "enable_access_log": False}
    serve.start(http_options={"host": settings.host, "port": settings.port}, logging_config=logs)
    serve.run(build_app(args, settings, opts), name=APP_NAME, route_prefix="/", logging_config=logs)


def serve_cluster(args: EngineArgs, settings: ServerSettings, opts: ClusterOptions) -> int:
    import ray

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    temp_dir = start_ray(opts, tp=args.tensor_parallel_size)
    try:
        # After ray.init, which installs handlers of its own: a signal stops serving cleanly.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        deploy(args, settings, opts)
        log.info(
            "serving on http://%s:%d with %d engine replicas (router %s)",
            settings.host,
            settings.port,
            opts.replicas,
            opts.router,
        )
        stop.wait()
        log.info("shutting down (grace period %.0f s)", settings.shutdown_grace_s)
        shutdown_serve(settings.shutdown_grace_s)
    finally:
        going_down = _ray_going_down()
        stop_ray(ray, temp_dir, going_down)
    if going_down:
        # Ray's driver side outlives its processes here, and its finalizers would wait for
        # them, or crash, at interpreter exit: everything is stopped and removed, so leave now.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _ray_going_down() -> bool:
    """Whether any process of this driver's local Ray has exited: a signal sent to the process
    group reaches them too (its dashboard and log monitor exit at once, its workers, Serve's
    controller among them, too, and its raylet ~10 s later). False for a joined cluster."""
    try:
        from ray._private import worker

        node = worker._global_node
        return node is not None and bool(node.dead_processes())
    except Exception:  # Ray's internals moved: assume alive, the grace period still bounds
        return False


def shutdown_serve(grace_s: float) -> None:
    """`serve.shutdown()`, waited for while Serve's controller answers and for at most the
    grace period (plus a little for Serve's own steps). Without a controller it would wait 30 s,
    and Ray's raylet, shutting down too, would then end this process before its cleanup."""
    from ray import serve

    done = threading.Thread(target=serve.shutdown, name="serve-shutdown", daemon=True)
    deadline = time.monotonic() + grace_s + 2.0
    time.sleep(SHUTDOWN_POLL_S)  # the same signal, if sent to the group, reaches Ray now
    if not _ray_going_down():
        done.start()
    while done.is_alive() and time.monotonic() < deadline:
        done.join(SHUTDOWN_POLL_S)
        if _ray_going_down():
            break
    if _ray_going_down():
        log.warning("Ray's processes got the signal too: stopping Ray without Serve's drain")
    if done.is_alive():
        log.warning("Serve did not shut down within the grace period: stopping Ray")


def stop_ray(ray, temp_dir: str | None, going_down: bool = False) -> None:
    """Ray down, and its temp dir (a local Ray's) removed once nothing writes to it.
    `going_down`: its processes got the signal (their raylet drains for ~10 s, and the driver's
    disconnect would wait for it): they are stopped first, with nothing left to drain."""
    if going_down:
        try:
            from ray._private import worker

            worker._global_node.kill_all_processes(check_alive=False, allow_graceful=False)
        except Exception as exc:
            log.warning("stopping Ray's processes: %r", exc)
            going_down = False
    if not going_down:  # (its driver side would wait seconds for the killed raylet)
        try:
            ray.shutdown()
        except Exception as exc:  # already dead: nothing more to stop
            log.warning("ray.shutdown: %r", exc)
    if not temp_dir:
        return
    for _ in range(20):  # a process Ray stopped may still be closing its logs
        shutil.rmtree(temp_dir, ignore_errors=True)
        if not os.path.exists(temp_dir):
            return
        time.sleep(0.1)
    log.warning("could not remove Ray's temp dir %s", temp_dir)
