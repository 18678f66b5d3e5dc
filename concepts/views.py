"""HTTP views of the concepts app. The `$match` / `$rerank` views live with the capacity gate (api/);
they call `concepts.services`."""
from django.db.models import Count
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from concepts.models import Source


class SourceSerializer(serializers.Serializer):
    url = serializers.CharField(help_text='What `target_repo_url` takes.')
    org = serializers.CharField()
    mnemonic = serializers.CharField()
    name = serializers.CharField()
    version = serializers.CharField()
    concept_count = serializers.IntegerField()


class SourceListView(APIView):
    """The loaded concept sources (authentication and permissions: the project defaults)."""

    @extend_schema(responses=SourceSerializer(many=True))
    def get(self, request):
        sources = Source.objects.annotate(concept_count=Count('concepts')).order_by('org', 'mnemonic')
        return Response(SourceSerializer(sources, many=True).data)
