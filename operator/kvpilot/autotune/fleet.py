"""A fleet of simulated trtllm-serve replicas behind a least-loaded balancer, in simulated time.

It stands in for a Deployment: a configuration change is rolled one replica at a time; a restarting
replica stops taking requests, drains what it holds (up to the pods' termination grace period), then is
down for ``restart_s`` (model load) before it serves again with the new configuration.

Clients give up: a streaming client that has seen no token ``client_timeout_s`` after it sent its request
disconnects (an HTTP client's read timeout). Like a gateway, the balancer then forgets the request if it is
still queued there; like trtllm-serve (its handlers await the client's disconnect and abort the request), a
replica aborts it if it holds it, so it frees its batch slot and KV blocks instead of being served to nobody.
Either way it is a miss. Without this, a backlog built while the limit was too low is served long after its
clients left, and every later request waits behind it: no change of the limit could ever recover.

A gateway may also shed load (``queue_timeout_s``): a request not yet scheduled that long after its arrival
is rejected (at the balancer) or cancelled (in the replica), as a server-side queue policy with a timeout
does. Under sustained overload a first-come-first-served queue otherwise fills to the client timeout and
every request served has waited about that long (all miss a TTFT objective of seconds); with shedding the
requests that are served are served in time, and goodput is what the capacity allows.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from kvsim import Engine, EngineConfig, Request, RequestRecord, RequestRejected

GRACE_SECONDS = 60.0  # the serving pods' terminationGracePeriodSeconds


@dataclass
class Replica:
    name: str
    config: EngineConfig
    engine: Engine
    state: str = "up"  # up | draining | down
    until_s: float = 0.0
    next_config: EngineConfig | None = None
    restarts: int = 0
    held: list[RequestRecord] = field(default_factory=list)
    replaces: Replica | None = None  # surge: the old replica this new one takes over from once Ready
    retire: bool = False  # surge: an old replica draining out of the fleet
    unstarted: deque[RequestRecord] = field(default_factory=deque)  # sent, no first token yet (arrival order)
    unscheduled: deque[RequestRecord] = field(default_factory=deque)  # sent, not scheduled yet (arrival order)
    sent: int = 0  # requests sent to it, and of those the ones it aborted (client gone, or shed): a canary's share
    gave_up: int = 0

    def load(self) -> int:
        """Outstanding requests (queued, waiting for blocks, running): what a least-loaded balancer counts."""
        return self.engine.outstanding()


class Fleet:
    """``queue_factor`` bounds what each replica holds to that many times its batch limit, as a gateway
    queue does; the rest waits at the balancer. A request with no first token ``client_timeout_s`` after its
    arrival is abandoned by its client: dropped at the balancer (``dropped``) or aborted in its replica
    (``abandoned``); both are misses."""

    def __init__(self, config: EngineConfig, replicas: int, restart_s: float, epoch_s: float = 0.0,
                 queue_factor: float = 2.0, client_timeout_s: float = 60.0, surge: bool = False,
                 queue_timeout_s: float | None = None, max_surge: int = 1, iteration_stats: bool = True):
        """``surge``: roll with maxSurge ``max_surge``, maxUnavailable 0 (a new pod becomes Ready before an old
        one drains). A surge pod holds its GPU from its start, and an old pod holds its GPU until it has
        drained, so at most ``max_surge`` new or draining pods exist at once (the spare GPUs).
        ``iteration_stats``: False where nothing drains the pods' iteration stats (the what-if, static runs;
        kvsim.Engine then builds none): the same run, for less CPU."""
        self.restart_s = restart_s
        self.surge = surge
        self.max_surge = max(1, max_surge)
        self.queue_factor = queue_factor
        self.client_timeout_s = client_timeout_s
        self.queue_timeout_s = queue_timeout_s
        self.iteration_stats = iteration_stats
        self.replicas = [Replica(f"r{i}", config, self._engine(config, epoch_s)) for i in range(replicas)]
        self.backlog: deque[Request] = deque()  # waiting at the balancer (no replica had room)
        self.dropped = 0
        self.abandoned = 0
        self.shed = 0  # by the gateway's queue timeout (at the balancer or cancelled in a replica)
        self.records: list[RequestRecord] = []
        self.lost: list[RequestRecord] = []
        self.placed: dict[int, str] = {}  # id of a request's record -> the replica it was sent to
        self.canary_config: EngineConfig | None = None  # a paused rollout's new configuration (see roll_to)
        self._split = 0  # requests routed while a canary is judged (its share, see _canary_split)
        self.now = 0.0

    def _engine(self, config: EngineConfig, epoch_s: float) -> Engine:
        return Engine(config, epoch_s=epoch_s, iteration_stats=self.iteration_stats)

    # -- traffic ------------------------------------------------------------------------------------------
    def advance(self, t_s: float) -> None:
        for r in self.replicas:
            if r.state != "down":
                r.engine.advance_to(t_s)
        self.now = t_s
        self._abandon()
        self._transitions()

    def _room(self, r: Replica, load: int) -> int:
        """What ``r`` may still take, holding ``load`` (its ``load()``)."""
        return int(self.queue_factor * (r.config.max_batch_size or r.config.build_max_batch_size)) + 16 - load

    def submit(self, request: Request) -> None:
        if self.backlog:  # first come, first served at the balancer too
            self.backlog.append(request)
            self._dispatch()
            return
        if not self._send(request):
            self.backlog.append(request)

    def _send(self, request: Request) -> bool:
        # least loaded among the replicas with room: during a rollout a pod with the new, larger limit has
        # room while an old one is full, and the balancer must not stop at the old one
        up = [r for r in self.replicas if r.state == "up"]
        load = {id(r): r.load() for r in up}  # once per replica per request
        open_ = [r for r in up if self._room(r, load[id(r)]) > 0]
        if self.canary_config is not None:
            open_ = self._canary_split(open_)
        if not open_:
            return False
        target = min(open_, key=lambda r: (load[id(r)], r.name))
        try:
            record = target.engine.submit(request, now_s=request.arrival_s)
        except RequestRejected:
            return True  # never servable: it counts as a miss (its arrival is in the workload total)
        target.held.append(record)
        target.sent += 1
        self.placed[id(record)] = target.name
        target.unstarted.append(record)
        if self.queue_timeout_s is not None:
            target.unscheduled.append(record)
        self.records.append(record)
        if len(target.held) > 4096:
            target.held = [x for x in target.held if x.finish_s is None]  # amortized: keep only the live ones
        return True

    def _abandon(self) -> None:
        """Abort, in the replica holding it, every request whose client gave up before its first token."""
        deadline = self.now - self.client_timeout_s
        for r in self.replicas:
            pending = r.unstarted
            while pending:
                record = pending[0]
                if record.first_token_s is not None or record.finish_s is not None:
                    pending.popleft()  # streaming (its client stays) or over
                elif record.arrival_s <= deadline:
                    pending.popleft()
                    if r.state != "down" and r.engine.abort(record):
                        self.abandoned += 1
                        r.gave_up += 1
                else:
                    break  # sent in arrival order: the rest are younger
            if self.queue_timeout_s is None:
                continue
            waiting = r.unscheduled
            shed_before = self.now - self.queue_timeout_s
            while waiting:
                record = waiting[0]
                if record.start_s is not None or record.finish_s is not None:
                    waiting.popleft()
                elif record.arrival_s <= shed_before:
                    waiting.popleft()
                    if r.state != "down" and r.engine.abort(record):
                        self.shed += 1
                        r.gave_up += 1
                else:
                    break

    def _canary_split(self, open_: list[Replica]) -> list[Replica]:
        """While a canary is judged, it is sent its share of the requests (canary pods over serving pods, every
        k-th request, as a Service spreads connections over its endpoints), not what a least-loaded choice would
        give it: a pod with a larger limit has more room, and would otherwise be judged on a load it will never
        see once every pod runs that limit."""
        up = [r for r in self.replicas if r.state == "up"]
        canary = [r for r in up if r.config == self.canary_config]
        if not canary or len(canary) == len(up):
            return open_
        self._split += 1
        k, n = len(canary), len(up)
        to_canary = (self._split * k) // n != ((self._split - 1) * k) // n
        return [r for r in open_ if (r.config == self.canary_config) == to_canary]

    @property
    def gave_up(self) -> int:
        """Requests that left without an answer: clients that gave up, and load the gateway shed."""
        return self.dropped + self.abandoned + self.shed

    def _dispatch(self) -> None:
        wait = min(self.client_timeout_s, self.queue_timeout_s if self.queue_timeout_s is not None else math.inf)
        while self.backlog and self.now - self.backlog[0].arrival_s > wait:
            self.backlog.popleft()
            self.dropped += 1  # the client gave up, or the gateway shed it
        while self.backlog and self._send(self.backlog[0]):
            self.backlog.popleft()

    # -- rollouts -----------------------------------------------------------------------------------------
    def rolling(self) -> bool:
        return any(r.state != "up" or r.next_config is not None for r in self.replicas)

    def roll_to(self, config: EngineConfig, pods: int | None = None) -> None:
        """Replace every replica's configuration, one at a time (maxSurge 0, maxUnavailable 1; or with surge).

        ``pods``: roll at most that many of the replicas still to roll, and hold the rest (a paused rollout: the
        first replaced pod is a canary; ``roll_to`` again promotes it, or rolls it back with the old config). A
        replica already at ``config`` forgets a change it was waiting for, and a surge pod not yet Ready that
        would bring another configuration is cancelled (its old pod stays)."""
        todo = pods if pods is not None else len(self.replicas)
        self.canary_config = config if pods is not None else None
        for r in self.replicas:
            if r.retire or (r.replaces is not None and r.state == "down"):
                continue  # draining out, or a surge pod still starting: handled through the pod it replaces
            if r.config == config:
                r.next_config = None
            elif todo > 0 or r.next_config is not None:
                if r.next_config is None:
                    todo -= 1
                r.next_config = config
        starting = [r for r in self.replicas if r.replaces is not None and r.state == "down"]
        for r in starting:
            if r.replaces is not None and r.replaces.next_config != r.config:
                self.replicas.remove(r)  # cancelled before it served: its GPU goes back
        self._start_next_restart()

    def pod_of(self, record: RequestRecord) -> str | None:
        """The name of the replica a request was sent to (None: it never left the balancer)."""
        return self.placed.get(id(record))

    def configs(self) -> set[EngineConfig]:
        return {r.config for r in self.replicas}

    def _start_next_restart(self) -> None:
        if self.surge:
            self._start_surge_pods()
            return
        if any(r.state != "up" for r in self.replicas):
            return
        for r in self.replicas:
            if r.next_config is not None:
                r.state, r.until_s = "draining", self.now + GRACE_SECONDS
                return

    def _start_surge_pods(self) -> None:
        """Start a new pod for each replica still to roll, while a spare GPU is free (see ``max_surge``)."""
        busy = sum(1 for r in self.replicas if r.replaces is not None or r.retire)
        replaced = {id(r.replaces) for r in self.replicas if r.replaces is not None}
        for r in list(self.replicas):
            if busy >= self.max_surge:
                return
            if r.next_config is not None and not r.retire and r.replaces is None and id(r) not in replaced:
                self.replicas.append(Replica(r.name + "'", r.next_config,
                                             self._engine(r.next_config, r.engine.epoch_s), state="down",
                                             until_s=self.now + self.restart_s, restarts=r.restarts + 1, replaces=r))
                busy += 1

    def _transitions(self) -> None:
        for r in list(self.replicas):
            if r.retire and (r.load() == 0 or self.now >= r.until_s):
                self.lost += [x for x in r.held if x.finish_s is None]
                self.replicas.remove(r)
                self._start_next_restart()
            elif r.replaces is not None and r.state == "down" and self.now >= r.until_s:
                old, r.replaces = r.replaces, None
                r.engine.advance_to(self.now)
                r.state = "up"
                old.state, old.until_s, old.next_config, old.retire = "draining", self.now + GRACE_SECONDS, None, True
            elif r.state == "draining" and (r.load() == 0 or self.now >= r.until_s):
                self.lost += [x for x in r.held if x.finish_s is None]  # cut off by the restart
                r.held = []
                r.unstarted.clear()
                r.unscheduled.clear()
                r.state, r.until_s = "down", self.now + self.restart_s
            elif r.state == "down" and self.now >= r.until_s:
                r.config = r.next_config or r.config
                r.next_config = None
                r.engine = self._engine(r.config, r.engine.epoch_s)
                r.engine.advance_to(self.now)
                r.state = "up"
                r.restarts += 1
                self._start_next_restart()
        self._dispatch()

    def next_transition(self) -> float:
        times = [r.until_s for r in self.replicas if r.state in ("draining", "down")]
        return min(times) if times else math.inf
