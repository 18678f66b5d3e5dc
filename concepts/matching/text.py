"""Text normalization shared by every matcher: one place decides what counts as the same word."""
import re
import unicodedata

_NON_WORD = re.compile(r'[^0-9a-z]+')


def normalize(text):
    """Lower-case, accents stripped, each run of non-alphanumerics one space.

    'Crohn’s  Disease' -> 'crohn s disease'.
    """
    text = unicodedata.normalize('NFKD', text)
    text = ''.join(ch for ch in text if not unicodedata.combining(ch)).lower()
    return _NON_WORD.sub(' ', text).strip()


def stem(token):
    """A deliberately small English stemmer: plural and possessive -s only (kidneys -> kidney).

    Words ending in -is/-us/-ss/-os (stenosis, villus, abscess) keep their s; anything cleverer mangles
    Greek and Latin terms more than it helps.
    """
    if len(token) > 3 and token.endswith('s') and not token.endswith(('ss', 'us', 'is', 'os')):
        if token.endswith('ies') and len(token) > 4:
            return token[:-3] + 'y'
        return token[:-1]
    return token


def tokens(text):
    """Normalized, stemmed word tokens in order (duplicates kept)."""
    return [stem(token) for token in normalize(text).split()]
