"""The call keeps what is its own (owner, usage, Idempotency-Key, admission, how it was served, when it was
made and cancelled); what the run did lives on its Work (0008, 0009). HeavyCall becomes Call, on the same
table."""
import django.db.models.deletion
from django.db import migrations, models

RUN_FIELDS = ('queue', 'semantic', 'reranker', 'priority', 'payload', 'work_key', 'leader', 'detached_at', 'state',
              'error', 'error_status', 'error_body', 'attempts', 'worker', 'heartbeat_at', 'lease_lost',
              'limiter_error', 'expires_at', 'started_at', 'finished_at', 'refunded_at')


class Migration(migrations.Migration):

    dependencies = [
        ('workers', '0009_backfill_work'),
    ]

    operations = [
        migrations.RemoveIndex(model_name='heavycall', name='heavy_call_queue'),
        migrations.RemoveIndex(model_name='heavycall', name='heavy_call_state_finished'),
        *(migrations.RemoveField(model_name='heavycall', name=name) for name in RUN_FIELDS),
        migrations.AlterField(
            model_name='heavycall',
            name='work',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='calls',
                                    to='workers.work'),
        ),
        migrations.RenameModel(old_name='HeavyCall', new_name='Call'),
    ]
