"""`manage.py capacity show|set|reset|history|status`: the staff endpoints' operations from a shell.

    manage.py capacity set tiers.preview=1 mode=enforce --note "evening batch" --user alice
    manage.py capacity reset --user alice
    manage.py capacity history --limit 5

Every action prints JSON. Changes are saved with source "command".
"""
import json
import re

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from capacity.config import get_current, get_history, merge, nest, save_config
from capacity.constants import SOURCE_COMMAND

WHOLE_NUMBER = re.compile(r'-?[0-9]+')


def parse_assignment(assignment):
    """`'tiers.preview=1'` -> `{'tiers': {'preview': 1}}`; a value that is a whole number becomes an int."""
    path, equals, raw = assignment.partition('=')
    if not equals or not path:
        raise CommandError(f'Expected <setting>=<value>, got "{assignment}".')
    return nest(path, int(raw) if WHOLE_NUMBER.fullmatch(raw) else raw)


class Command(BaseCommand):
    help = "Show, change or reset the capacity config, list its versions, or show the lanes' status."

    def add_arguments(self, parser):
        parser.add_argument('action', choices=('show', 'set', 'reset', 'history', 'status'))
        parser.add_argument('assignments', nargs='*', metavar='setting=value',
                            help='for set: a dotted setting and its value, e.g. tiers.preview=1')
        parser.add_argument('--note', default='', help='why the change was made (set, reset)')
        parser.add_argument('--user', help='the username the change is recorded under (set, reset)')
        parser.add_argument('--limit', type=int, default=20, help='how many versions history lists')

    def handle(self, *args, action, assignments, **options):
        if assignments and action != 'set':
            raise CommandError(f'"{action}" takes no <setting>=<value>.')
        data = getattr(self, f'do_{action}')(assignments, **options)
        self.stdout.write(json.dumps(data, indent=2, default=str))

    def do_show(self, assignments, **options):
        row, config = get_current()
        return {'version': row.id if row else None, 'config': config.to_json()}

    def do_status(self, assignments, **options):
        from capacity.status import get_status  # reads Redis; only this action needs it
        return get_status(get_current()[1])

    def do_history(self, assignments, limit, **options):
        return [{**item, 'created_at': item['created_at'].isoformat()} for item in get_history(limit)]

    def do_set(self, assignments, **options):
        if not assignments:
            raise CommandError('Give at least one <setting>=<value>.')
        changes = {}
        for assignment in assignments:
            changes = merge(changes, parse_assignment(assignment))
        return self.save(changes, replace=False, **options)

    def do_reset(self, assignments, **options):
        return self.save({}, replace=True, **options)

    def save(self, changes, replace, note, user, **options):
        user = self.get_user(user) if user else None
        try:
            row, config, changed = save_config(
                changes, user=user, source=SOURCE_COMMAND, note=note, replace=replace)
        except ValidationError as ex:
            raise CommandError(' '.join(ex.messages)) from ex
        return {'version': row.id if row else None, 'changes': changed}

    def get_user(self, username):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f'No user "{username}".')
        return user
