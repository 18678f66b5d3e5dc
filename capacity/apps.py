from django.apps import AppConfig


class CapacityApp(AppConfig):
    name = 'capacity'
    verbose_name = 'Capacity limiter'
