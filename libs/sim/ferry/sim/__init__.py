"""Development and simulation: what stands in for the cloud and injects faults on one machine.

    metadata_server  a fake cloud metadata endpoint (AWS, GCP, Azure paths) that announces spot
                     interruptions, one per simulated node of `ferry up`
    chaos            `ferry chaos`: a simulated node killed, a notice armed, a live move made to fail
    faults           the one fault hook of live moves: armed by `ferry chaos fail-live PHASE`, taken
                     by the scheduler, carried to the node command of that phase

Nothing here runs in a real deployment: the API refuses chaos outside `ferry up`.
"""
