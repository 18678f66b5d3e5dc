"""Development tooling: `make run` (python -m devstack) and the process helpers bench/ and the tests share.

Not part of the service (deploy/Dockerfile doesn't copy it). Modules:

- processes: a child process as the leader of its own process group, stopped by group with a grace period
  then SIGKILL; free_port, port_in_use, http_get, tail.
"""
