"""Development tooling: `make run` (python -m devstack) and the process helpers bench/ and the tests share.

Not part of the service: deploy/Dockerfile doesn't copy it, and the embedded Redis needs requirements/dev.txt.
Only prepare's steps (in children of their own) load Django; importing any module here doesn't.

- processes: a child process as the leader of its own process group, stopped by group with a grace period
  then SIGKILL; free_port, port_in_use, http_get, tail.
- redis_server: a redis-server or the embedded server on a free port, and ping.
- embedded_redis: the fakeredis TCP server (python -m devstack.embedded_redis --port N).
- launcher: the Launcher of `make run`; services: the processes it starts; banner: what it prints;
  files: VAR_DIR and its private JSON files; prepare: the database and index steps.

Errors: launcher.Stop (carries the exit code) ends a run; redis_server.RedisStartError says a Redis of our
own could not start.
"""
