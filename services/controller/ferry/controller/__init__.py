"""Ferry's Kubernetes controller and node agent: the first turns the decisions of
``ferry.kube.reconcile`` into FerryCheckpoint requests, events, conditions and replacement pods;
the second (one per node) carries out the FerryCheckpoint requests of its node's pods through
containerd's CRI and runc, into Ferry's store."""
