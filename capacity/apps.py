from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = 'capacity'
    verbose_name = 'Capacity limiter'
