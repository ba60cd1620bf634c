"""The local control plane: etcd, kube-apiserver, the controllers, kwok nodes and a local kubelet.

``cluster`` drives it from Python; the shell scripts next to it stay the source of truth for paths and
versions. ``localkubelet.py`` and ``uptools.py`` run as scripts (cluster-up.sh starts them) and import only
their neighbours.
"""
