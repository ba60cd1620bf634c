"""podagent — the local kubelet (entry point: hack/testenv/localkubelet.py): runs pods labelled serving.kvpilot.io/backend=simulated, from their images under podman or as local processes.

The local control plane has no container runtime (no Docker on our machines, fake nodes from kwok),
yet the simulated backend's pods must really serve, so their IPs, probes, restarts and exit codes are
what the operator observes. This agent plays the kubelet's part for exactly those pods; kwok's stages
skip them. Modules:

    podspec    pure translation of a container spec into a local process (argv, env, paths)
    volumes    materialises volumes (emptyDir, configMap, secret, PVC/hostPath) as local directories
    probes     startup/readiness/liveness probe state machines
    process    one container run: spawn, output capture, termination message, stop
    podman     the podman runner: a container run from its image (podman run), when the image is built
    status     pure construction of the pod status the API server gets
    worker     the lifecycle of one pod (init containers, restarts, back-off, deletion)
    kube       the boundary to the API server (list/watch/patch through the kubernetes client, as dicts)
    agent      list+watch loop, pod IP allocation, shutdown
"""

SIMULATED_SELECTOR = "serving.kvpilot.io/backend=simulated"
