"""What a client is told about a call that didn't succeed, and the lifecycle's limits."""
ERROR_LENGTH = 2000
ROW_WAIT_SECONDS = 5.0
CANCELLED = 'The call was cancelled.'
EXPIRED = 'The call waited in its queue past its deadline and was not run.'
FAILED = 'The call failed.'
SOFT_LIMIT = 'The call was stopped by its time limit ({seconds} s, max_hold_seconds) and did not finish.'
HARD_LIMIT = ('The call was stopped by its hard time limit ({seconds} s): its worker process did not end it '
              'at the soft limit and was killed.')
