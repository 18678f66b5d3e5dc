from django.urls import path

from concepts import views

urlpatterns = [
    path('sources/', views.SourceListView.as_view(), name='sources'),
]
