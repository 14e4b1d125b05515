"""Ferry under Kubernetes' own pods: the node side (a runc-compatible runtime that containerd's runc
shim calls through the RuntimeClass handler ``ferry``, a CRI client, checkpoints of a running
container into Ferry's store) and the controller's pure reconcile decisions."""
