"""Calls made before the run id had its column (workers 0012) keep their run: it is copied from their
admission's facts, so GET and DELETE /tasks/?run= find them too. On SQLite, and on PostgreSQL."""
import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from capacity import gate
from capacity.caller import RequestFacts
from capacity.constants import Lane
from workers import runs

BEFORE = ('workers', '0011_answer_count')


def deploy_across_the_migration(make_user):
    user = make_user()
    call_command('migrate', 'workers', BEFORE[1], verbosity=0)
    try:
        apps = MigrationExecutor(connection).loader.project_state(BEFORE).apps
        Work, Call = apps.get_model('workers', 'Work'), apps.get_model('workers', 'Call')
        made = {}
        for name, run in (('in-run', 'run-9'), ('no-run', None)):
            admission = gate.admit(user, endpoint='$match', rows=1, semantic=True, queue='es2_knn',
                                   draws_on=Lane.ES2_KNN, facts=RequestFacts(automatch_run_id=run))
            work = Work.objects.create(id=admission.token, endpoint='$match', queue='es2_knn', payload={},
                                       expires_at='2030-01-01T00:00:00Z')
            Call.objects.create(id=admission.token, owner_id=user.pk, work=work, endpoint='$match',
                                fingerprint='f', admission=admission.to_json())
            made[name] = admission.token
    finally:
        call_command('migrate', verbosity=0)
    assert [call.pk for call in runs.listed(owner=user, run='run-9')] == [made['in-run']]
    assert runs.listed(owner=user).get(pk=made['no-run']).run_id == ''


@pytest.mark.django_db(transaction=True)
def test_calls_made_before_the_run_column_keep_their_run(make_user, lanes):
    deploy_across_the_migration(make_user)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_calls_made_before_the_run_column_keep_their_run_on_postgres(make_user, lanes):
    deploy_across_the_migration(make_user)


BEFORE_WHOLE = ('workers', '0013_work_rows_done')
LONG_RUN = 'mapper-2026-12-05T08:39:21.512Z-7f3a'  # 36 characters: the API kept 'mapper-2026-12-05T08'


def deploy_across_the_whole_run_id(make_user):
    user = make_user()
    call_command('migrate', 'workers', BEFORE_WHOLE[1], verbosity=0)
    try:
        apps = MigrationExecutor(connection).loader.project_state(BEFORE_WHOLE).apps
        Work, Call = apps.get_model('workers', 'Work'), apps.get_model('workers', 'Call')
        made = {}
        for name, run in (('cut', LONG_RUN[:20]), ('short', 'run-9')):
            work = Work.objects.create(id=name, endpoint='$match', queue='es2_knn', payload={},
                                       expires_at='2030-01-01T00:00:00Z')
            Call.objects.create(id=name, owner_id=user.pk, work=work, endpoint='$match', fingerprint='f',
                                run_id=run)
            made[name] = name
    finally:
        call_command('migrate', verbosity=0)
    # The client filters by the id it sent: the call stored with its first 20 characters is found by it.
    assert [call.pk for call in runs.listed(owner=user, run=LONG_RUN)] == ['cut']
    assert [call.pk for call in runs.listed(owner=user, run=LONG_RUN[:20])] == ['cut']
    assert [call.pk for call in runs.listed(owner=user, run='run-9')] == ['short']
    assert [call.pk for call in runs.listed(owner=user, run=LONG_RUN[:20] + '-another')] == ['cut']


@pytest.mark.django_db(transaction=True)
def test_calls_stored_with_a_run_ids_first_20_characters_are_found_by_the_whole_id(make_user, lanes):
    deploy_across_the_whole_run_id(make_user)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_calls_stored_with_a_run_ids_first_20_characters_are_found_by_the_whole_id_on_postgres(make_user, lanes):
    deploy_across_the_whole_run_id(make_user)
