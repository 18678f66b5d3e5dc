"""Root URLs: the public HTTP contract of docs/api.md."""
from django.urls import include, path

from api import views

urlpatterns = [
    path('healthz', views.HealthView.as_view(), name='healthz'),
    path('capacity/', include('capacity.urls')),
    path('', include('concepts.urls')),
]
