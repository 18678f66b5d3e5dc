"""Matching over a concept source: pure functions and index objects, no Django models, no HTTP.

- `text`: normalization and tokens; `table`: a source's concepts as entries (names and synonyms).
- `bm25` and `index.LexicalIndex`: lexical retrieval; `embedders` and `index.SemanticIndex`: embedding kNN.
- `rerank`: finer scoring of a few candidates; `pipeline.match`: retrieve, then optionally rerank.
- `store`: where indexes are persisted, built once across processes, and cached in each process.
"""
