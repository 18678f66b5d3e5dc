"""`manage.py create_demo_users [--tokens-file PATH]`: one demo user per tier, with API tokens.

    demo-staff    staff         (is_staff)
    demo-core     core          (group CORE_USER_GROUP, core_user)
    demo-early    early_access  (group EARLY_ACCESS_GROUP, early_access)
    demo-preview  preview       (group PREVIEW_GROUP, preview; preview is also the default tier)

Idempotent: a second run finds the same users and tokens, and puts back the flags and groups that give each
user its tier if someone changed them. The users are made without a password (token authentication only);
one given later (`manage.py changepassword demo-staff`, to log in to the lanes page) is kept. The tokens
are printed and written to `<VAR_DIR>/demo-tokens.json` as
`{"tokens": [{"username", "tier", "token"}, ...], "staff_token": ...}` (readable by the owner only).
Refuses to run with HEAVY_LANES_PRODUCTION=true unless given --force.
"""
import json
import os
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from rest_framework.authtoken.models import Token

from capacity.caller import get_tier
from capacity.constants import CORE, EARLY_ACCESS, PREVIEW, STAFF


def demo_users():
    """(username, tier, group name or None, is_staff), highest tier first."""
    return (
        ('demo-staff', STAFF, None, True),
        ('demo-core', CORE, settings.CORE_USER_GROUP, False),
        ('demo-early', EARLY_ACCESS, settings.EARLY_ACCESS_GROUP, False),
        ('demo-preview', PREVIEW, settings.PREVIEW_GROUP, False),
    )


def write_private(path, text):
    """Write `text` to `path` atomically, readable by the owner only."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, 'w') as handle:
        handle.write(text)
    os.replace(temporary, path)


class Command(BaseCommand):
    help = ('Create (or find) one demo user per tier (demo-staff, demo-core, demo-early, demo-preview) with '
            'API tokens; print the tokens and write them to VAR_DIR/demo-tokens.json.')

    def add_arguments(self, parser):
        parser.add_argument('--tokens-file', default=None, metavar='PATH',
                            help='where to write the tokens as JSON (default: VAR_DIR/demo-tokens.json)')
        parser.add_argument('--force', action='store_true',
                            help='run even with HEAVY_LANES_PRODUCTION=true (demo accounts in production)')

    def handle(self, tokens_file, force, **options):
        if getattr(settings, 'PRODUCTION', False) and not force:
            raise CommandError('HEAVY_LANES_PRODUCTION is on: demo users are for local runs (use --force '
                               'to create them anyway).')
        User = get_user_model()
        rows = []
        with transaction.atomic():
            for username, tier, group_name, is_staff in demo_users():
                user, created = User.objects.get_or_create(username=username)
                if created:  # a password someone set since (changepassword, as the banner says) is kept
                    user.set_unusable_password()
                user.is_staff = is_staff
                user.is_superuser = False
                user.is_active = True
                user.save()
                user.groups.set([Group.objects.get_or_create(name=group_name)[0]] if group_name else [])
                token, _ = Token.objects.get_or_create(user=user)
                actual = get_tier(user)
                if actual != tier:  # the tier rules changed under us: say so rather than print a wrong label
                    raise CommandError(f'{username} should be tier {tier} but is {actual}.')
                rows.append({'username': username, 'tier': tier, 'token': token.key})
                self.stdout.write(f'{username:<13} {tier:<13} {token.key}'
                                  f'{"  (created)" if created else ""}')
        document = {'tokens': rows, 'staff_token': next(row['token'] for row in rows if row['tier'] == STAFF)}
        path = Path(tokens_file) if tokens_file else Path(settings.VAR_DIR) / 'demo-tokens.json'
        write_private(path, json.dumps(document, indent=2) + '\n')
        self.stdout.write(f'Tokens written to {path}')
