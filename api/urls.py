"""Root URLs: the public HTTP contract (docs/api.md, and the OpenAPI schema at /schema/)."""
from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from api import task_views, views

urlpatterns = [
    path('healthz', views.HealthView.as_view(), name='healthz'),
    path('readyz', views.ReadyView.as_view(), name='readyz'),
    path('metrics', views.MetricsView.as_view(), name='metrics'),
    path('concepts/$match/', views.MatchView.as_view(), name='concepts-match'),
    path('concepts/$rerank/', views.RerankView.as_view(), name='concepts-rerank'),
    path('tasks/', task_views.TaskListView.as_view(), name='tasks'),
    path('tasks/<str:call_id>/', views.TaskView.as_view(), name='task'),
    path('tasks/<str:call_id>/retry/', task_views.RetryView.as_view(), name='task-retry'),
    path('capacity/', include('capacity.urls')),
    path('schema/', SpectacularAPIView.as_view(), name='schema'),
    path('schema/docs/', SpectacularSwaggerView.as_view(url_name='schema'), name='schema-docs'),
    path('admin/', admin.site.urls),
    path('', include('concepts.urls')),
]

admin.site.site_header = admin.site.site_title = 'Heavy Lanes admin'
admin.site.site_url = '/capacity/dashboard/'  # the admin's "view site": the staff lanes page

# Static files (the admin's, the lanes page's, the API page's) are served before any URL is looked at, by
# WhiteNoise's middleware (api/settings.py).

# Benchmark floors (api/bench_views.py): only with HEAVY_LANES_BENCH_VIEWS, which production never has.
urlpatterns += [path('bench/', include('api.bench_views'))] if settings.HEAVY_LANES_BENCH_VIEWS else []

# What Django answers without a view (DEBUG off), in the API's JSON shape (api.errors).
handler400 = 'api.errors.bad_request'
handler403 = 'api.errors.permission_denied'
handler404 = 'api.errors.not_found'
handler500 = 'api.errors.server_error'
