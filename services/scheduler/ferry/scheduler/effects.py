"""Carries out a transition's effects (``ferry.scheduler.ops.step``) in order: records to KV,
commands to the nodes, events to the bus."""

import logging

import tenacity

from ferry.common import wire
from ferry.common.bus import BusError
from ferry.scheduler.ops.gang import GangStep, SaveGang
from ferry.scheduler.ops.step import Emit, SaveJob, SaveOp, Send, Step
from ferry.scheduler.state import ClusterState


def command_id(cmd: wire.NodeCommand) -> str:
    """The node command's message id: the same for the same command of the same op, so that a
    command sent again (a redelivery, a restarted scheduler) is delivered once."""
    return f"{cmd.kind}-{cmd.job.id}-{cmd.job.incarnation}-{cmd.op or 'auto'}-{cmd.checkpoint or ''}"


log = logging.getLogger(__name__)

SEND_RETRY_S = 60.0
"""How long a node command is retried while NATS does not take it (a cluster's stream leader
being elected again after a server died takes seconds). The job's record already says the command
went out: a command given up on would leave the job waiting for it until the scheduler restarts."""
SEND_RETRY_WAIT_S = 0.25  # the first wait; each next one doubles, to 4 s


class Effects:
    def __init__(self, state: ClusterState) -> None:
        self.state = state

    async def apply(self, step: Step | GangStep | None) -> None:
        if step is None:
            return
        for effect in step.effects:
            if isinstance(effect, SaveJob):
                await self.state.save_job(effect.job, effect.event, effect.message)
            elif isinstance(effect, SaveOp):
                await self.state.save_op(effect.op)
            elif isinstance(effect, Send):
                await self.send(effect.service, effect.cmd)
            elif isinstance(effect, Emit):
                await self.state.emit(effect.event)
            elif isinstance(effect, SaveGang):
                await self.state.bus.gangs.put(wire.gang_key(effect.record.gang, effect.record.id), effect.record)

    async def send(self, service: wire.NodeService, cmd: wire.NodeCommand) -> None:
        """Sends `cmd` to `service` on the node ``cmd.job.node``."""
        assert cmd.job.node
        cmd.id = command_id(cmd)
        log.info("%s %s of %s on %s", service, cmd.kind, cmd.job.name, cmd.job.node)

        def log_retry(state: tenacity.RetryCallState) -> None:
            log.warning("cannot send %s of %s yet: %s", cmd.kind, cmd.job.name,
                        state.outcome.exception() if state.outcome else "")

        # the message id makes a command that did arrive before its ack was lost arrive once
        retrying = tenacity.AsyncRetrying(retry=tenacity.retry_if_exception_type(BusError), reraise=True,
                                          wait=tenacity.wait_exponential(multiplier=SEND_RETRY_WAIT_S, max=4.0),
                                          stop=tenacity.stop_after_delay(SEND_RETRY_S), before_sleep=log_retry)
        subject = wire.node_cmd_subject(cmd.job.node, service)
        await retrying(self.state.bus.publish, subject, cmd, msg_id=cmd.id)
