from django.apps import AppConfig


class ApiApp(AppConfig):
    name = 'api'
    label = 'api'
    verbose_name = 'Heavy Lanes HTTP API'
