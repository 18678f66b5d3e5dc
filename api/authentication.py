"""DRF's token authentication, with the token kept per process (workers.local_cache) instead of read on
every request: the lookup was 18 % of an API process's Python time under the load mix (docs/benchmarks.md,
2026-12-03). A token that is deleted or replaced, or whose user is changed (deactivated, made staff) or
deleted, is dropped in every API process once the change commits (`api.apps` connects the signals);
`HEAVY_LANES_LOCAL_CACHE_SECONDS` bounds what no signal announces, such as `User.objects.update(...)`.

Only a successful lookup is kept: an unknown token or an inactive user is refused by DRF's own code every
time. Each request gets copies of the kept user and token, so nothing a request sets on them reaches another.
"""
import copy

from rest_framework.authentication import TokenAuthentication

from workers.local_cache import TOKEN, LocalCache, changed

TOKENS = LocalCache(TOKEN)


class KeptTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key):
        user, token = TOKENS.get(key, lambda: super(KeptTokenAuthentication, self).authenticate_credentials(key))
        user, token = copy.copy(user), copy.copy(token)
        token.user = user
        return user, token


def token_changed(sender, instance, using=None, **kwargs):
    """A token was saved or deleted: every process drops it."""
    changed(TOKENS.name, instance.key, using=using)


def user_changed(sender, instance, using=None, update_fields=None, **kwargs):
    """A user was saved or deleted: every process drops every token it kept (a user's tokens aren't indexed
    by user; a change to a user is rare). A login's `last_login` alone changes nothing a token answers."""
    if update_fields is not None and set(update_fields) <= {'last_login'}:
        return
    changed(TOKENS.name, using=using)
