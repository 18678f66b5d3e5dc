"""The concepts app's error tree.

    ConceptsError                 base of everything raised on purpose here
    ├── UnknownTerminology        `load_terminology NAME` names no terminology this app can load
    ├── TerminologyFormatError    a shipped terminology file could not be parsed (carries path, line)
    ├── UnknownEmbedder           CONCEPTS_EMBEDDER / CONCEPTS_RERANKER names no implementation
    └── EmbedderUnavailable       the embedder exists but its packages (or their pinned files) are not installed

Request validation is not part of this tree: `concepts.services` raises DRF's `ValidationError`, which the
views render as 400.
"""


class ConceptsError(Exception):
    """Base class of the concepts app's errors."""


class UnknownTerminology(ConceptsError):
    def __init__(self, name, known):
        self.name = name
        self.known = tuple(known)
        super().__init__(f'unknown terminology {name!r}; known: {", ".join(self.known)}')


class TerminologyFormatError(ConceptsError):
    def __init__(self, path, line, message):
        self.path = str(path)
        self.line = line
        super().__init__(f'{self.path}:{line}: {message}')


class UnknownEmbedder(ConceptsError):
    def __init__(self, name, known, kind='embedder'):
        self.name = name
        self.known = tuple(known)
        self.kind = kind
        super().__init__(f'unknown {kind} {name!r}; known: {", ".join(self.known)}')


class EmbedderUnavailable(ConceptsError):
    def __init__(self, name, missing, requirements='requirements/base.txt'):
        self.name = name
        self.missing = missing
        super().__init__(f'embedder {name!r} needs the package {missing!r}: pip install -r {requirements}')
