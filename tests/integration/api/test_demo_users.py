"""`manage.py create_demo_users`, which every `make run` runs again."""
import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client


def create_demo_users(tokens_file):
    call_command('create_demo_users', '--tokens-file', str(tokens_file), stdout=io.StringIO())
    return json.loads(tokens_file.read_text())


@pytest.mark.django_db
def test_a_second_run_keeps_the_staff_password_and_the_tokens_it_printed(tmp_path):
    tokens_file = tmp_path / 'demo-tokens.json'
    first = create_demo_users(tokens_file)
    staff = get_user_model().objects.get(username='demo-staff')
    assert not staff.has_usable_password()  # token authentication only, until someone sets one
    staff.set_password('a password the banner said to set')  # manage.py changepassword demo-staff
    staff.save()

    assert create_demo_users(tokens_file) == first

    assert Client().login(username='demo-staff', password='a password the banner said to set')
    assert Client().get('/sources/', HTTP_AUTHORIZATION=f'Token {first["staff_token"]}').status_code == 200
