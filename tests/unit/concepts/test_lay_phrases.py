"""The lay-phrase test set: phrases no HPO name or synonym says, each with concepts a clinician accepts."""
from concepts.matching.text import normalize
from concepts.terminology import read_hpo, read_lay_phrases


def test_there_are_at_least_thirty_distinct_phrases():
    phrases = [phrase for phrase, _ in read_lay_phrases()]
    assert len(phrases) >= 30 and len({normalize(phrase) for phrase in phrases}) == len(phrases)


def test_no_phrase_is_a_name_or_synonym_of_the_terminology():
    said = {normalize(text) for concept in read_hpo().concepts for text in (concept.name, *concept.synonyms)}
    assert [phrase for phrase, _ in read_lay_phrases() if normalize(phrase) in said] == []


def test_every_accepted_concept_exists_under_the_name_the_set_gives_it():
    names = {concept.code: concept.name for concept in read_hpo().concepts}
    for phrase, accepted in read_lay_phrases():
        assert accepted, phrase
        assert {code: names.get(code) for code in accepted} == accepted, phrase
