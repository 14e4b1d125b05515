"""Ferry's decisions as pure functions, shared by the scheduler service and the CLI's `simulate`.

    decisions   where a job goes, when to move it, what a move costs and saves (``JobView``/``NodeView``)
    placement   which nodes can take a job at all
    views       the decision inputs built from the cluster's records
    fallback    which older checkpoint a restore falls back to
    simulate    the policies replayed over spot-availability traces
"""
