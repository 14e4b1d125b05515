"""The scheduler's operations as pure transitions, one module per operation.

Each transition takes the job, its op, what happened (a node's report, a user's request) and what
it needs to know of the cluster, and returns a ``Step``: the job and op as they are now, and the
effects (records to write, node commands to send, events to publish) in the order the scheduler
service must carry them out (``ferry.scheduler.effects``). No transition touches the bus.
"""
