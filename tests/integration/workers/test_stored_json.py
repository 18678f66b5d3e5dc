"""A stored result read back in slices (workers.lifecycle.StoredJSON), on SQLite and on PostgreSQL, where
a big text is stored compressed out of line and a slice is a substring by characters."""
import json
import uuid
from datetime import timedelta

import pytest
from celery import states
from django.utils import timezone

from workers.celery import app
from workers.lifecycle import StoredJSON, result_json, stored_result
from workers.models import Call, Work

pytestmark = pytest.mark.django_db


@pytest.fixture(params=['sqlite', pytest.param('postgres', marks=pytest.mark.postgres)])
def database(request):
    from django.db import connection
    if (connection.vendor == 'postgresql') != (request.param == 'postgres'):
        pytest.skip(f'runs in the {request.param} pass of make test')
    return request.param


@pytest.fixture
def queued(make_user):
    work = Work.objects.create(id=uuid.uuid4().hex, endpoint='$match', payload={'rows': []}, queue='es2_knn',
                               expires_at=timezone.now() + timedelta(minutes=10))
    Call.objects.create(id=work.pk, owner=make_user(), work=work, endpoint='$match', fingerprint='f')
    return work


def test_a_text_read_in_slices_is_the_text_as_stored(database, queued, settings):
    answer = [{'row': {'name': f'fièvre {i} ✓'}, 'results': [{'id': f'HP:{i}', 'display_name': 'x' * 700}]}
              for i in range(3000)]
    app.backend.store_result(queued.pk, answer, states.SUCCESS)
    text = stored_result(queued.pk)
    assert len(text) > 2_000_000
    settings.RESULT_SLICE_CHARACTERS = 300_001  # an odd size: slices end mid-character-run
    stored = result_json(Call.objects.get(pk=queued.pk))
    assert stored.text is None and len(stored) == len(text)  # not read whole
    parts = list(stored.slices())
    assert len(parts) == -(-len(text) // 300_001) and ''.join(parts) == text
    assert json.loads(stored.whole()) == answer


def test_a_short_text_is_read_whole_and_a_missing_one_is_none(database, queued):
    assert result_json(Call.objects.get(pk=queued.pk)) is None
    app.backend.store_result(queued.pk, [{'n': 1}], states.SUCCESS)
    stored = result_json(Call.objects.get(pk=queued.pk))
    assert isinstance(stored, StoredJSON) and stored.text == '[{"n": 1}]'
