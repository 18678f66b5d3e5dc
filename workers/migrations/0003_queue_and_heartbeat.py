from django.db import migrations, models

# The log record's keys for each lane's count and limit, as the first admission form stored them.
LEGACY_FIELDS = {
    'api_heavy': ('in_flight', 'limit'), 'api_heavy_task': ('task_in_flight', 'task_limit'),
    'es2_knn': ('es2_knn_in_flight', 'es2_knn_limit'), 'tier': ('tier_in_flight', 'tier_limit'),
    'user': ('user_in_flight', 'user_limit'),
}
CALL_FIELDS = ('endpoint', 'rows', 'tier', 'user_id', 'semantic', 'reranker', 'waits', 'host', 'queue')
FACT_FIELDS = ('queue_ms', 'request_source', 'algorithm_id', 'automatch_run_id', 'cid')


def lane_of(key):
    """`{prefix}:<lane>[:<part>]` -> <lane>."""
    return key.split('}:', 1)[-1].split(':', 1)[0]


def to_admission(old, call):
    """The first form ({decision, holding, keys, limits, record}) as capacity.admission.Admission.to_json."""
    record = old.get('record') or {}
    lanes = []
    for key, limit in zip(old.get('keys') or [], old.get('limits') or []):
        lane = lane_of(key)
        count_field = LEGACY_FIELDS.get(lane, (None, None))[0]
        lanes.append([lane, key, limit, record.get(count_field)])
    call_data = None
    if record:
        call_data = {name: record.get(name) for name in CALL_FIELDS}
        call_data.update(queue=call.queue, waits=bool(record.get('waits')), host=record.get('host') or '',
                         semantic=bool(record.get('semantic')), reranker=bool(record.get('reranker')),
                         draws_on=None, wait_slot=False)
    return {
        'decision': old.get('decision'), 'token': call.pk, 'call': call_data, 'mode': record.get('mode'),
        'enforced': bool(record.get('enforced')), 'lanes': lanes, 'full': record.get('full') or [],
        'holding': bool(old.get('holding')), 'lease_ms': 0, 'retry_after': record.get('retry_after'),
        'suggested': record.get('suggested'), 'error': record.get('error'),
        'facts': {name: record.get(name) for name in FACT_FIELDS},
    }


def convert(apps, schema_editor):
    HeavyCall = apps.get_model('workers', 'HeavyCall')
    for call in HeavyCall.objects.filter(admission__has_key='record').iterator():
        call.admission = to_admission(call.admission, call)
        call.save(update_fields=['admission'])


class Migration(migrations.Migration):
    """`lane` held the Celery queue (a lane is a lease lane); a running call gets a heartbeat; the
    admission JSON takes the form of capacity.admission.Admission."""

    dependencies = [
        ('workers', '0002_usage_on_the_call_row'),
    ]

    operations = [
        migrations.RemoveIndex(model_name='heavycall', name='heavy_call_queue'),
        migrations.RenameField(model_name='heavycall', old_name='lane', new_name='queue'),
        migrations.AddIndex(
            model_name='heavycall',
            index=models.Index(fields=['queue', 'state', 'priority', 'created_at'], name='heavy_call_queue'),
        ),
        migrations.AddField(
            model_name='heavycall',
            name='heartbeat_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(convert, migrations.RunPython.noop),
    ]
