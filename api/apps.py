from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = 'api'
    label = 'api'
    verbose_name = 'Heavy Lanes HTTP API'
