"""The lifecycle of one simulated pod, in its own thread: volumes, init containers in order, the
containers with their probes, restarts with back-off, exit handling, and graceful deletion.

The worker is the single writer of its pod's status: after each step it recomputes the whole status
(status.py) and patches it only when it changed, so the API server sees the same transitions a
kubelet would produce (Pending -> Running/Ready -> Succeeded/Failed, CrashLoopBackOff, ...).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

from . import status as st
from .config import MULTINODE_LABEL, AgentConfig, ImageMissing
from .kube import Kube
from .lifecycle import run_pre_stop_hooks
from .podspec import ConfigError, path_rewriter, plan_launch
from .probes import LIVENESS, READINESS, STARTUP, ProbeContext, ProbeTracker, run_probe, trackers_for
from .podman import PodmanRun, apply_fs_group, image_present, mount_modes, plan_podman
from .process import ContainerRun, rfc3339_now, stop_all
from .volumes import container_mounts, materialize

log = logging.getLogger("localkubelet.worker")


# `podman exec` needs a second or more on a loaded 2-core machine before the probe's command even starts.
EXEC_PROBE_OVERHEAD_S = 10.0
# How often the worker compares the status in the API server with what it published (the kubelet's status
# manager syncs every 10 s); between checks the watch's lag behind our own patch is not mistaken for a change.
RECONCILE_EVERY_S = 10.0


class PodWorker(threading.Thread):
    """Runs one pod until it is deleted (or the agent stops)."""

    def __init__(self, pod: dict, pod_ip: str, host_ip: str, cfg: AgentConfig, kube: Kube) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.key, self.uid = f"{meta['namespace']}/{meta['name']}", meta["uid"]
        self.cfg, self.kube, self.pod_ip, self.host_ip = cfg, kube, pod_ip, host_ip
        self._pod, self._lock, self._wake = pod, threading.Lock(), threading.Event()
        self._shutdown = threading.Event()
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.pod_dir = cfg.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{self.uid[:8]}"
        self.log_dir = cfg.state_dir / "logs" / "pods" / meta["namespace"] / meta["name"]
        prior = {c["name"]: c for c in (pod.get("status") or {}).get("containerStatuses") or []}
        self.init_statuses = [st.ContainerStatus(c["name"], c.get("image", "")) for c in spec.get("initContainers") or []]
        self.statuses = {c["name"]: st.ContainerStatus(c["name"], c.get("image", "")) for c in spec["containers"]}
        for name, cs in self.statuses.items():  # an agent restart counts as a restart of what was running
            if name in prior:
                cs.restart_count = int(prior[name].get("restartCount", 0)) + ("running" in prior[name].get("state", {}))
        conditions = (pod.get("status") or {}).get("conditions") or []
        already_initialized = any(c["type"] == "Initialized" and c["status"] == "True" for c in conditions)
        self.init_index = len(self.init_statuses) if already_initialized else 0
        self.stage = "setup"  # setup -> init -> main -> done
        self.init_failed = False
        self.volume_paths: dict[str, Path] = {}
        self.runs: dict[str, ContainerRun] = {}
        self.trackers: dict[str, dict[str, ProbeTracker]] = {}
        self.probe_ctx: dict[str, ProbeContext] = {}
        self.next_start: dict[str, float] = {}
        self.backoff: dict[str, float] = {}
        self.start_time = (pod.get("status") or {}).get("startTime") or rfc3339_now()
        self.conditions: list[dict] = conditions
        self.published: dict | None = None
        self.reconciled_at = time.monotonic()
        self.setup_error = ""
        self.terminal_override: str | None = None

    # ------------------------------------------------------------------ called from the agent thread
    def update(self, pod: dict) -> None:
        """Hand the worker the newest version of its pod (it reacts to a deletionTimestamp)."""
        with self._lock:
            self._pod = pod
        self._wake.set()

    def shutdown(self) -> None:
        """Agent stop: kill the processes at once, leave the pod as it is."""
        self._shutdown.set()
        self._wake.set()

    @property
    def pod(self) -> dict:
        """The newest known pod object."""
        with self._lock:
            return self._pod

    def _pod_as_assigned(self) -> dict:
        """The pod with the IPs this worker assigned, even before the watch echoes our own status patch:
        a container started right away must already see its pod IP (fieldRef status.podIP, `0.0.0.0`)."""
        pod = self.pod
        status = {
            **(pod.get("status") or {}),
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "hostIP": self.host_ip,
        }
        return {**pod, "status": status}

    # ------------------------------------------------------------------ the thread
    def run(self) -> None:
        """Step the pod until it is deleted or the agent stops; never leaves a process behind."""
        try:
            while not self._shutdown.is_set():
                meta = self.pod["metadata"]
                if meta.get("deletionTimestamp"):
                    self._finish_deletion(meta)
                    return
                try:
                    self._step()
                    if not self._publish():
                        log.info("%s: pod is gone; stopping its containers", self.key)
                        return
                except Exception:
                    log.exception("%s: step failed; retrying", self.key)
                    time.sleep(1)
                self._wake.wait(self.cfg.tick_s)
                self._wake.clear()
        finally:
            stop_all(self.runs, 0 if self._shutdown.is_set() else 2)

    def _delete_after_stop(self, meta: dict) -> None:
        """Complete a graceful deletion once the processes are gone; retried while the API is unreachable."""
        for attempt in range(30):
            try:
                self.kube.delete_pod_now(meta["namespace"], meta["name"], self.uid)
                log.info("%s: containers stopped, pod deleted", self.key)
                return
            except Exception as exc:  # noqa: BLE001 - keep trying, the API may be restarting
                log.warning("%s: deleting the pod failed (attempt %d): %s", self.key, attempt + 1, exc)
                if self._shutdown.wait(1):
                    return

    def _finish_deletion(self, meta: dict) -> None:
        """Graceful deletion as the kubelet does it: stop the containers, move the pod to a terminal phase
        (so a Job controller accounts it), then delete it with grace period 0."""
        grace = float(meta.get("deletionGracePeriodSeconds", 30))
        running = [c for c in self.pod["spec"].get("containers", []) if c.get("name") in self.runs]
        prefixes = {name: ctx.exec_prefix for name, ctx in self.probe_ctx.items()}
        grace = run_pre_stop_hooks(running, grace, exec_prefixes=prefixes)  # e.g. a serving pod's drain delay
        codes = stop_all(self.runs, grace)
        now = rfc3339_now()
        for name, code in codes.items():
            cs = self.statuses.get(name)
            if cs is not None:
                reason = "Completed" if code == 0 else "Error"
                cs.state = {"terminated": {"exitCode": code, "reason": reason, "finishedAt": now}}
                cs.ready = cs.started = False
        self.terminal_override = "Succeeded" if codes and all(c == 0 for c in codes.values()) else "Failed"
        if self.stage == "done":
            self.terminal_override = None  # already terminal: keep the phase it reached
        try:
            self._publish()
        except Exception as exc:  # noqa: BLE001 - the deletion below matters more than this status
            log.warning("%s: final status patch failed: %s", self.key, exc)
        self._delete_after_stop(meta)

    # ------------------------------------------------------------------ one step
    def _step(self) -> None:
        """Advance the pod by one tick."""
        now = time.monotonic()
        if self.stage == "setup":
            try:
                self.volume_paths = materialize(self._pod_as_assigned(), self.pod_dir, self.cfg.state_dir / "volumes", self.kube.get)
                if self.cfg.podman:
                    apply_fs_group(self.pod, self.volume_paths)
                self.stage, self.setup_error = "init", ""
            except ConfigError as exc:
                self.setup_error = str(exc)
                for cs in [*self.init_statuses, *self.statuses.values()]:
                    cs.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
                return
        if self.stage == "init":
            self._step_init(now)
        if self.stage == "main":
            for container in self.pod["spec"]["containers"]:
                self._step_container(container, now)
            if st.pod_phase(self.restart_policy, False, list(self.statuses.values()), True) in ("Succeeded", "Failed"):
                self.stage = "done"

    def _step_init(self, now: float) -> None:
        """Run the init containers one after another; any failure under restartPolicy Never fails the pod."""
        inits = self.pod["spec"].get("initContainers") or []
        while self.init_index < len(inits):
            container, cs = inits[self.init_index], self.init_statuses[self.init_index]
            run = self.runs.get(cs.name)
            if run is None:
                if now >= self.next_start.get(cs.name, 0):
                    self._start(container, cs, now)
                return
            code = run.poll()
            if code is None:
                return
            del self.runs[cs.name]
            term = self._terminated(run, container, code)
            if code == 0:
                cs.state, cs.ready = {"terminated": term}, True
                self.init_index += 1
                continue
            if self.restart_policy == "Never":
                cs.state, self.init_failed, self.stage = {"terminated": term}, True, "done"
                return
            self._back_off(cs, term, now)
            return
        for cs in self.statuses.values():
            cs.state = {"waiting": {"reason": "ContainerCreating"}}
        self.stage = "main"

    def _step_container(self, container: dict, now: float) -> None:
        """Start, watch, probe and restart one regular container."""
        cs = self.statuses[container["name"]]
        run = self.runs.get(cs.name)
        if run is None:
            if cs.terminated is None and now >= self.next_start.get(cs.name, 0):
                self._start(container, cs, now)
            return
        code = run.poll()
        if code is None:
            self._probe(container, cs, run, now)
            return
        self._exited(container, cs, run, code, now)

    def _exited(self, container: dict, cs: st.ContainerStatus, run: ContainerRun, code: int, now: float) -> None:
        """Record an exit; restart it (with back-off) when the restart policy says so."""
        del self.runs[cs.name]
        self.trackers.pop(cs.name, None)
        term = self._terminated(run, container, code)
        cs.ready = cs.started = False
        if self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0):
            self._back_off(cs, term, now, ran_s=now - run.started_mono)
        else:
            cs.state = {"terminated": term}
        log.info("%s: container %s exited with %d", self.key, cs.name, code)

    def _back_off(self, cs: st.ContainerStatus, term: dict, now: float, ran_s: float = 0.0) -> None:
        """CrashLoopBackOff: wait, then start again; the delay doubles up to the cap and resets after a
        run that lasted longer than twice the cap (the kubelet resets after 10 minutes of running)."""
        delay = self.backoff.get(cs.name, self.cfg.backoff_initial_s)
        if ran_s > 2 * self.cfg.backoff_max_s:
            delay = self.cfg.backoff_initial_s
        self.backoff[cs.name] = min(delay * 2, self.cfg.backoff_max_s)
        self.next_start[cs.name] = now + delay
        cs.restart_count += 1
        cs.last_state = {"terminated": term}
        cs.state = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:g}s restarting failed container={cs.name} pod={self.key}",
            }
        }

    def _terminated(self, run: ContainerRun, container: dict, code: int) -> dict:
        """The API's terminated state for a finished run."""
        term = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": rfc3339_now(),
        }
        message = run.termination_message(code, container.get("terminationMessagePolicy", "File"))
        if message:
            term["message"] = message
        return term

    def _uses_podman(self, container: dict) -> bool:
        """Whether this container runs from its image under podman (else as a local process)."""
        if not self.cfg.podman:
            return False
        if MULTINODE_LABEL in (self.pod["metadata"].get("labels") or {}):
            return False  # MPI over SSH: the sshd/mpirun stand-ins are process-runner shims (docs/testenv.md)
        image = container.get("image", "")
        if image and image_present(self.cfg.podman, image):
            return True
        if self.cfg.require_image:
            raise ImageMissing(f"image {image!r} is not in the local store and is never pulled here (make images)")
        return False

    def _launch(self, container: dict, name: str) -> tuple[ContainerRun, ProbeContext, str]:
        """Start one run with the runner that applies; returns the run, its probe context and its containerID."""
        mounts = container_mounts(container, self.volume_paths)
        pod = self._pod_as_assigned()
        ports = {p["name"]: int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name")}
        log_path = self.log_dir / f"{name}.log"
        pgid_file = self.cfg.state_dir / "run" / "pod-pgids" / f"{self.uid}_{name}"
        termination_log = os.fspath(self.pod_dir / "termination" / name)
        if self._uses_podman(container):
            plan = plan_podman(container, pod, mount_modes(container, mounts), termination_log, self.kube.get,
                               self.cfg.podman or "podman", os.fspath(self.cfg.state_dir))
            run: ContainerRun = PodmanRun(plan, log_path, pgid_file, self.pod_dir)
            ctx = ProbeContext(self.pod_ip, ports, dict(os.environ), os.fspath(self.pod_dir), lambda text: text,
                               (plan.argv[0], "exec", plan.name), EXEC_PROBE_OVERHEAD_S)
            return run, ctx, f"podman://{plan.name}"
        launch = plan_launch(container, pod, mounts, self.cfg.base_env, self.cfg.shims, termination_log,
                             os.fspath(self.pod_dir / "rootfs"), self.kube.get)
        run = ContainerRun(launch, log_path, pgid_file)
        ctx = ProbeContext(self.pod_ip, ports, launch.env, launch.cwd, path_rewriter(mounts))
        return run, ctx, f"process://{run.pgid}"

    def _start(self, container: dict, cs: st.ContainerStatus, now: float) -> None:
        """Spawn one container run; a spec it cannot satisfy becomes a waiting reason, like the kubelet's."""
        name = container["name"]
        try:
            run, ctx, container_id = self._launch(container, name)
        except ImageMissing as exc:
            cs.state = {"waiting": {"reason": "ErrImageNeverPull", "message": str(exc)}}
            self.next_start[name] = now + 5
            return
        except ConfigError as exc:
            cs.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            self.next_start[name] = now + 2
            return
        except OSError as exc:  # e.g. the program does not exist here: the runtime's StartError, exit 128
            term = {"exitCode": 128, "reason": "StartError", "message": str(exc), "finishedAt": rfc3339_now()}
            if self.restart_policy == "Never":
                cs.state = {"terminated": term}
                if any(cs is init for init in self.init_statuses):
                    self.init_failed, self.stage = True, "done"
            else:
                self._back_off(cs, term, now)
            log.warning("%s: container %s failed to start: %s", self.key, name, exc)
            return
        self.runs[name] = run
        cs.state = {"running": {"startedAt": run.started_at}}
        cs.container_id = container_id
        cs.image_id = container.get("image", "") if container_id.startswith("podman://") else ""
        self.probe_ctx[name] = ctx
        self.trackers[name] = trackers_for(container, run.started_mono)
        cs.started = STARTUP not in self.trackers[name]
        cs.ready = cs.started and READINESS not in self.trackers[name]
        runner = container_id.split(":", 1)[0]
        log.info("%s: started container %s (runner %s, image %s): %s", self.key, name, runner,
                 container.get("image", ""), " ".join(run.plan.argv))

    def _probe(self, container: dict, cs: st.ContainerStatus, run: ContainerRun, now: float) -> None:
        """Run the due probes; a failed startup/liveness probe restarts the container."""
        trackers, ctx = self.trackers.get(cs.name, {}), self.probe_ctx[cs.name]
        startup = trackers.get(STARTUP)
        kinds = [STARTUP] if startup and not startup.passed else [READINESS, LIVENESS]
        for kind in kinds:
            tracker = trackers.get(kind)
            if tracker is None or not tracker.due(now):
                continue
            ok, message = run_probe(tracker.spec, ctx)
            if tracker.record(ok, message, time.monotonic()) and kind != READINESS:
                log.info("%s: %s of %s failed (%s); restarting it", self.key, kind, cs.name, message)
                grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
                self._exited(container, cs, run, run.stop(grace), now)
                return
        cs.started = startup is None or startup.passed
        readiness = trackers.get(READINESS)
        cs.ready = cs.started and (readiness is None or readiness.passed)

    # ------------------------------------------------------------------ status
    def _publish(self) -> bool:
        """Patch the pod's status if it changed; False when the pod no longer exists."""
        init_list = self.init_statuses
        containers = list(self.statuses.values())
        running = self.stage in ("main", "done") and not self.init_failed
        phase = self.terminal_override or st.pod_phase(self.restart_policy, self.init_failed, containers, running)
        initialized = self.init_index >= len(init_list) and not self.init_failed
        now = rfc3339_now()
        self.conditions = st.pod_conditions(phase, initialized, containers, self.conditions, now)
        status = st.pod_status(
            phase=phase,
            pod_ip=self.pod_ip,
            host_ip=self.host_ip,
            start_time=self.start_time,
            conditions=self.conditions,
            init_containers=init_list,
            containers=containers,
            message=self.setup_error,
            reason="",
        )
        if status == self.published and not self._overwritten():
            return True
        meta = self.pod["metadata"]
        if not self.kube.patch_pod_status(meta["namespace"], meta["name"], self.uid, status):
            return False
        self.published = status
        self.reconciled_at = time.monotonic()
        return True

    def _overwritten(self) -> bool:
        """Whether, at a periodic check, another writer has changed the status we published (see st.disagrees)."""
        if time.monotonic() - self.reconciled_at < RECONCILE_EVERY_S:
            return False
        self.reconciled_at = time.monotonic()
        if self.published is None or not st.disagrees(self.published, self.pod.get("status")):
            return False
        log.info("%s: status in the API server differs from ours (another writer); writing ours again", self.key)
        return True
