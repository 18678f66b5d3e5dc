"""The cluster harness: Heavy Lanes in its production shape on one machine, one network namespace per host,
with the faults of a cluster whose hosts restart all the time (docs/cluster.md, `make cluster`)."""
