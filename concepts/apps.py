from django.apps import AppConfig


class ConceptsApp(AppConfig):
    name = 'concepts'
    verbose_name = 'Concept repositories and matching'
