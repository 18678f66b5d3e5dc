"""A run of work gets a record of its own (Work); a call points at it. The backfill is 0009, the old call
fields go in 0010: three migrations, so the backfill's row updates and the ALTERs that follow them are in
transactions of their own (PostgreSQL refuses to alter a table with row updates pending in the same one).
"""
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workers', '0007_shared_work'),
    ]

    operations = [
        migrations.CreateModel(
            name='Work',
            fields=[
                ('id', models.CharField(editable=False, max_length=32, primary_key=True, serialize=False)),
                ('work_key', models.CharField(blank=True, db_index=True, default='', max_length=64)),
                ('endpoint', models.CharField(max_length=16)),
                ('semantic', models.BooleanField(default=False)),
                ('reranker', models.BooleanField(default=False)),
                ('rows', models.PositiveIntegerField(default=0)),
                ('payload', models.JSONField()),
                ('queue', models.CharField(max_length=32)),
                ('priority', models.PositiveSmallIntegerField(default=9)),
                ('state', models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'),
                                                    ('succeeded', 'Succeeded'), ('failed', 'Failed'),
                                                    ('cancelled', 'Cancelled'), ('expired', 'Expired')],
                                           default='queued', max_length=16)),
                ('lease', models.JSONField(default=dict)),
                ('holders', models.PositiveIntegerField(default=1)),
                ('shared', models.BooleanField(default=False)),
                ('attempts', models.PositiveSmallIntegerField(default=0)),
                ('worker', models.CharField(blank=True, default='', max_length=255)),
                ('heartbeat_at', models.DateTimeField(blank=True, null=True)),
                ('error', models.TextField(blank=True, default='')),
                ('error_status', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('error_body', models.JSONField(blank=True, null=True)),
                ('lease_lost', models.BooleanField(default=False)),
                ('limiter_error', models.CharField(blank=True, default='', max_length=300)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('expires_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'heavy_work',
                'indexes': [
                    models.Index(fields=['queue', 'state', 'priority', 'created_at'], name='heavy_work_queue'),
                    models.Index(fields=['state', 'finished_at'], name='heavy_work_state_finished'),
                ],
            },
        ),
        migrations.AddField(
            model_name='heavycall',
            name='work',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='calls',
                                    to='workers.work'),
        ),
        migrations.AddField(
            model_name='heavycall',
            name='cancelled_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
