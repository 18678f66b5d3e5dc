"""`ConceptTable`: a source's concepts as arrays, with every name and synonym as one *entry*.

Entries are grouped by concept, name first: concept ``i`` owns entries ``starts[i]:starts[i + 1]`` and entry
``starts[i]`` is its name. Matchers score entries, then take each concept's best entry (`concept_max`), so
a candidate can say which of its names matched.

A concept's definition (``definitions[i]``, '' when it has none) is kept beside the entries, not among them:
it is no name of the concept, so it never shows as one; a semantic index embeds it as an extra entry.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class ConceptRow:
    code: str
    name: str
    concept_class: str
    synonyms: tuple[str, ...] = ()
    definition: str = ''


@dataclass(frozen=True, eq=False)
class ConceptTable:
    codes: tuple[str, ...]
    classes: tuple[str, ...]
    texts: tuple[str, ...]          # every entry's text: each concept's name, then its synonyms
    owner: np.ndarray               # entry -> concept index (int32)
    starts: np.ndarray              # concept -> first entry; len(codes) + 1 offsets (int64)
    definitions: tuple[str, ...] = ()  # per concept, '' for none (empty: no concept has one)

    @classmethod
    def build(cls, rows):
        """Table of `rows` (ConceptRow-like), sorted by code: a lower index is a lower code, which is how
        matchers break ties."""
        rows = sorted(rows, key=lambda row: row.code)
        codes, classes, texts, owner, starts, definitions = [], [], [], [], [0], []
        for index, row in enumerate(rows):
            codes.append(row.code)
            classes.append(row.concept_class)
            definitions.append(getattr(row, 'definition', '') or '')
            names = [row.name, *row.synonyms]
            texts.extend(names)
            owner.extend([index] * len(names))
            starts.append(len(texts))
        return cls(tuple(codes), tuple(classes), tuple(texts), np.asarray(owner, dtype=np.int32),
                   np.asarray(starts, dtype=np.int64), tuple(definitions) if any(definitions) else ())

    def __len__(self):
        return len(self.codes)

    def name(self, concept):
        return self.texts[self.starts[concept]]

    def entries(self, concept):
        """The concept's texts, name first."""
        return self.texts[self.starts[concept]:self.starts[concept + 1]]

    def definition(self, concept):
        return self.definitions[concept] if self.definitions else ''

    def concept_max(self, entry_scores):
        """(queries x entries) scores -> (queries x concepts): each concept's best entry score."""
        if not len(self.codes):
            return np.zeros((entry_scores.shape[0], 0), dtype=entry_scores.dtype)
        return np.maximum.reduceat(entry_scores, self.starts[:-1], axis=1)

    def best_entry(self, entry_scores_row, concept):
        """Index of the concept's best-scoring entry (its name when tied)."""
        start, end = int(self.starts[concept]), int(self.starts[concept + 1])
        return start + int(np.argmax(entry_scores_row[start:end]))

    # --- persistence: plain JSON, no pickles --------------------------------------------------------
    def save(self, directory):
        payload = {'codes': self.codes, 'classes': self.classes, 'texts': self.texts,
                   'starts': self.starts.tolist(), 'definitions': self.definitions}
        (Path(directory) / 'table.json').write_text(json.dumps(payload, ensure_ascii=False), encoding='utf-8')

    @classmethod
    def load(cls, directory):
        payload = json.loads((Path(directory) / 'table.json').read_text(encoding='utf-8'))
        starts = np.asarray(payload['starts'], dtype=np.int64)
        owner = np.repeat(np.arange(len(payload['codes']), dtype=np.int32), np.diff(starts))
        return cls(tuple(payload['codes']), tuple(payload['classes']), tuple(payload['texts']), owner, starts,
                   tuple(payload.get('definitions', ())))
