"""The local control plane: etcd, kube-apiserver, the controllers, kwok nodes and a local kubelet.

``cluster`` drives it from Python; the shell scripts next to it stay the source of truth for paths and
versions. cluster-up.sh starts ``localkubelet`` as a module (``python -m hack.testenv.localkubelet`` with the
repository root on PYTHONPATH) and ``uptools.py`` as a plain script (it imports only the standard library).
"""
