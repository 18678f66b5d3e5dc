"""Staff capacity endpoints and the lanes page, mounted at capacity/ (IsAdminUser: 401 anonymous, 403
non-staff)."""
from django.urls import path

from capacity import views

urlpatterns = [
    path('config/', views.CapacityConfigView.as_view(), name='capacity-config'),
    path('config/history/', views.CapacityConfigHistoryView.as_view(), name='capacity-config-history'),
    path('status/', views.CapacityStatusView.as_view(), name='capacity-status'),
    path('decisions/', views.CapacityDecisionsView.as_view(), name='capacity-decisions'),
    path('dashboard/', views.CapacityDashboardView.as_view(), name='capacity-dashboard'),
]
