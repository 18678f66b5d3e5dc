"""The semantic index build's model run: batches cut by characters (as before) against batches of one token
count (concepts.matching.minilm._batches), side by side, in CPU seconds.

A sample of the HPO's names and synonyms (cut at 128 tokens) and definitions (cut at 48), as an index build
embeds them, run through one one-thread model session (what each of a build's side-by-side sessions is):
each round runs both ways, in alternating order, and the figures are medians over rounds of the process's
CPU seconds (less noisy than wall time on a shared machine), projected to the whole HPO by the sample's
share. Both ways must give the same vectors (the largest difference is printed).

    .venv/bin/python bench/index_build.py [--names 6000] [--definitions 2000] [--rounds 3]

Writes bench/out/index_build.json.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers import write  # noqa: E402

from concepts.matching import adapter, minilm  # noqa: E402
from concepts.matching.table import ConceptRow, ConceptTable  # noqa: E402
from concepts.terminology import read_hpo  # noqa: E402


def by_characters(texts, ids):
    """The batches before: texts sorted by length in characters, BATCH at a time."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    return [order[start:start + minilm.BATCH] for start in range(0, len(order), minilm.BATCH)]


def by_tokens(texts, ids):
    return minilm._batches(ids)


def embed(runtime, texts, ids, batches):
    out = np.zeros((len(texts), minilm.DIMENSIONS), dtype=np.float32)
    for chosen in batches:
        out[chosen] = runtime.run_ids([ids[i] for i in chosen])
    return out


def padding(ids, batches):
    real = sum(len(tokens) for tokens in ids)
    return sum(max(len(ids[i]) for i in batch) * len(batch) for batch in batches) / real - 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--names', type=int, default=6000)
    parser.add_argument('--definitions', type=int, default=2000)
    parser.add_argument('--rounds', type=int, default=3)
    args = parser.parse_args(argv)

    rows = [ConceptRow(c.code, c.name, c.concept_class, tuple(c.synonyms), c.definition)
            for c in read_hpo().concepts]
    table = ConceptTable.build(rows)
    texts, _ = adapter.concept_texts(table)
    entries = len(table.texts)
    rng = np.random.default_rng(0)
    parts = {
        'names': ([texts[i] for i in sorted(rng.choice(entries, args.names, replace=False))],
                  minilm.MAX_TOKENS, entries),
        'definitions': ([texts[entries + i] for i in sorted(rng.choice(len(texts) - entries, args.definitions,
                                                                          replace=False))],
                        minilm.DEFINITION_TOKENS, len(texts) - entries),
    }
    runtime = minilm._Runtime(1)
    ways = {'characters': by_characters, 'tokens': by_tokens}
    cpu = {(part, way): [] for part in parts for way in ways}
    vectors, pads = {}, {}
    for number in range(args.rounds):
        for way in (ways if number % 2 == 0 else reversed(list(ways))):
            for part, (sample, max_tokens, _) in parts.items():
                sample = [' '.join(text.split()) for text in sample]
                ids = runtime.tokenize(sample, max_tokens)
                batches = ways[way](sample, ids)
                pads[part, way] = padding(ids, batches)
                started = time.process_time()
                vectors[part, way] = embed(runtime, sample, ids, batches)
                cpu[part, way].append(time.process_time() - started)
                print(f'round {number + 1} {part:<11} by {way:<10} {cpu[part, way][-1]:6.1f} s of CPU', flush=True)
    result = {'rounds': args.rounds, 'parts': {}}
    for part, (sample, _, whole) in parts.items():
        medians = {way: statistics.median(cpu[part, way]) for way in ways}
        result['parts'][part] = {
            'sample': len(sample), 'whole_hpo': whole,
            'cpu_seconds_median': {way: round(value, 2) for way, value in medians.items()},
            'projected_whole_hpo_cpu_seconds': {way: round(value * whole / len(sample), 1)
                                                for way, value in medians.items()},
            'padding_over_real_tokens': {way: round(pads[part, way], 3) for way in ways},
            'largest_difference': float(np.abs(vectors[part, 'characters'] - vectors[part, 'tokens']).max()),
        }
    total = {way: sum(p['projected_whole_hpo_cpu_seconds'][way] for p in result['parts'].values()) for way in ways}
    result['projected_whole_hpo_cpu_seconds'] = total
    result['ratio_tokens_to_characters'] = round(total['tokens'] / total['characters'], 3)
    for part, figures in result['parts'].items():
        print(f'{part}: median CPU {figures["cpu_seconds_median"]}, padding {figures["padding_over_real_tokens"]}, '
              f'largest difference {figures["largest_difference"]:.1e}')
    print(f'whole HPO, projected: {total} s of CPU; by tokens / by characters = '
          f'{result["ratio_tokens_to_characters"]}')
    write('index_build', result)


if __name__ == '__main__':
    main()
