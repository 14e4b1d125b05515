"""Carries out a transition's effects (``ferry.scheduler.ops.step``) in order: records to KV,
commands to the nodes, events to the bus."""

import logging

from ferry.common import wire
from ferry.scheduler.ops.step import Emit, SaveJob, SaveOp, Send, Step
from ferry.scheduler.state import ClusterState


def command_id(cmd: wire.NodeCommand) -> str:
    """The node command's message id: the same for the same command of the same op, so that a
    command sent again (a redelivery, a restarted scheduler) is delivered once."""
    return f"{cmd.kind}-{cmd.job.id}-{cmd.job.incarnation}-{cmd.op or 'auto'}-{cmd.checkpoint or ''}"


log = logging.getLogger(__name__)


class Effects:
    def __init__(self, state: ClusterState) -> None:
        self.state = state

    async def apply(self, step: Step | None) -> None:
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

    async def send(self, service: wire.NodeService, cmd: wire.NodeCommand) -> None:
        """Sends `cmd` to `service` on the node ``cmd.job.node``."""
        assert cmd.job.node
        cmd.id = command_id(cmd)
        log.info("%s %s of %s on %s", service, cmd.kind, cmd.job.name, cmd.job.node)
        await self.state.bus.publish(wire.node_cmd_subject(cmd.job.node, service), cmd, msg_id=cmd.id)
