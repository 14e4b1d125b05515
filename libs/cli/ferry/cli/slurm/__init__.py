"""Ferry under SLURM: the task a `--ferry` step runs instead of its program (`task`, what it decides
in `plan`), the bridge that mirrors drains and spot notices between SLURM and Ferry (`bridge`), and
SLURM's commands as they use them (`scontrol`). The SPANK plugin that swaps the task in is C, in
deploy/slurm."""
