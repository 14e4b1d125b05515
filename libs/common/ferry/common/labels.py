"""The job labels Ferry itself reads (a job's labels are otherwise the user's own, `ferry run --label`).

Kept free of imports: the CLI's start-up reads these."""

SOURCE_LABEL = "source"  # the integration that started the job: slurm, kubernetes, ray (`ferry ps --source`)
