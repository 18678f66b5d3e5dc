from django.apps import AppConfig


class ApiApp(AppConfig):
    name = 'api'
    label = 'api'
    verbose_name = 'Heavy Lanes HTTP API'

    def ready(self):
        from django.contrib.auth import get_user_model
        from django.db.models.signals import post_delete, post_save
        from rest_framework.authtoken.models import Token

        from api.authentication import token_changed, user_changed
        for signal in (post_save, post_delete):
            signal.connect(token_changed, sender=Token, dispatch_uid=f'heavy-lanes-token-{signal is post_save}')
            signal.connect(user_changed, sender=get_user_model(),
                           dispatch_uid=f'heavy-lanes-user-{signal is post_save}')
