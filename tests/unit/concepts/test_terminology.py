import pytest

from concepts.errors import TerminologyFormatError, UnknownTerminology
from concepts.terminology import (
    TermConcept,
    clean_synonyms,
    concepts_checksum,
    parse_obo,
    read_terminology,
    read_tiny,
    top_level_branches,
)

OBO = r'''format-version: 1.2
data-version: hp/releases/2025-01-16

[Term]
id: HP:0000001
name: All

[Term]
id: HP:0000118
name: Phenotypic abnormality
is_a: HP:0000001 ! All

[Term]
id: HP:0000005
name: Mode of inheritance
is_a: HP:0000001 ! All

[Term]
id: HP:0000107
name: Renal cyst
def: "A fluid-filled \"sac\"  of the kidney." [PMID:1, https://orcid.org/0000-0002]
synonym: "Kidney cyst" EXACT layperson []
synonym: "Cyst of the \"kidney\"" RELATED []
synonym: "Old renal cyst term" EXACT obsolete_synonym []
is_a: HP:0000118 {source="x"} ! Phenotypic abnormality

[Term]
id: HP:0005562
name: Multiple renal cysts
is_a: HP:0000107 ! Renal cyst

[Term]
id: HP:0000999
name: Retired
is_obsolete: true

[Typedef]
id: part_of
name: part of
'''


def test_an_obo_file_gives_terms_with_parents_unescaped_synonyms_and_no_obsolete_synonyms(tmp_path):
    path = tmp_path / 'mini.obo'
    path.write_text(OBO, encoding='utf-8')
    document = parse_obo(path)
    assert document.header['data-version'] == ['hp/releases/2025-01-16']
    terms = {term.id: term for term in document.terms}
    assert set(terms) == {'HP:0000001', 'HP:0000118', 'HP:0000005', 'HP:0000107', 'HP:0005562', 'HP:0000999'}
    assert terms['HP:0000107'].synonyms == ('Kidney cyst', 'Cyst of the "kidney"')
    assert terms['HP:0000107'].parents == ('HP:0000118',)
    assert terms['HP:0000999'].obsolete and not terms['HP:0000107'].obsolete
    assert terms['HP:0000107'].definition == 'A fluid-filled "sac" of the kidney.'  # references left out
    assert terms['HP:0005562'].definition == ''


def test_the_hpo_concepts_carry_their_definitions():
    from concepts.terminology import read_hpo
    concepts = {concept.code: concept for concept in read_hpo().concepts}
    assert concepts['HP:0004322'].definition.startswith('A height below that which is expected')
    assert sum(1 for concept in concepts.values() if concept.definition) > 16000


def test_each_term_is_classed_by_the_top_level_branch_it_descends_from(tmp_path):
    path = tmp_path / 'mini.obo'
    path.write_text(OBO, encoding='utf-8')
    branches = top_level_branches(parse_obo(path).terms, 'HP:0000001')
    assert branches['HP:0005562'] == 'Phenotypic abnormality'
    assert branches['HP:0000005'] == 'Mode of inheritance'
    assert branches['HP:0000001'] == ''


def test_a_synonym_line_that_cannot_be_read_names_the_file_and_line(tmp_path):
    path = tmp_path / 'bad.obo'
    path.write_text('[Term]\nid: HP:1\nname: X\nsynonym: no quotes here\n', encoding='utf-8')
    with pytest.raises(TerminologyFormatError, match=r'bad.obo:4'):
        parse_obo(path)


def test_synonyms_lose_blanks_duplicates_and_copies_of_the_name():
    assert clean_synonyms('Renal cyst', ['renal  CYST', 'Kidney cyst', ' kidney cyst ', '', 'Cyst']) == \
        ('Kidney cyst', 'Cyst')


def test_the_checksum_ignores_concept_order_but_not_content():
    a = TermConcept('A', 'Alpha', 'X', ('a',))
    b = TermConcept('B', 'Beta', 'X', ())
    assert concepts_checksum([a, b]) == concepts_checksum([b, a])
    assert concepts_checksum([a, b]) != concepts_checksum([a, TermConcept('B', 'Beta', 'X', ('b',))])
    assert concepts_checksum([a, b]) != concepts_checksum([a, TermConcept('B', 'Beta', 'X', (), 'A letter.')])


def test_the_tiny_terminology_has_forty_uniquely_coded_concepts():
    tiny = read_tiny()
    assert len(tiny.concepts) == 40
    assert len({c.code for c in tiny.concepts}) == 40
    assert all(c.name and c.concept_class for c in tiny.concepts)


def test_an_unknown_terminology_name_lists_the_known_ones():
    with pytest.raises(UnknownTerminology, match='hpo, tiny'):
        read_terminology('snomed')
