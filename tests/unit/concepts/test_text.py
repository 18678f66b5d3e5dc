from concepts.matching.text import normalize, stem, tokens


def test_normalize_folds_case_accents_and_punctuation_to_single_spaces():
    assert normalize('  Crohn’s   Disease (Adult-Onset) ') == 'crohn s disease adult onset'
    assert normalize('Ménière') == 'meniere'


def test_plurals_are_stemmed_but_latin_and_greek_endings_are_kept():
    words = ('kidneys', 'cysts', 'abnormalities', 'stenosis', 'villus', 'abscess', 'gas')
    stems = ['kidney', 'cyst', 'abnormality', 'stenosis', 'villus', 'abscess', 'gas']
    assert [stem(t) for t in words] == stems


def test_tokens_of_a_phrase_are_normalized_and_stemmed_in_order():
    assert tokens('Multiple Kidney-Cysts') == ['multiple', 'kidney', 'cyst']
