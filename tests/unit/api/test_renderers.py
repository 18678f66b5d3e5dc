"""The API's JSON renderer writes a stored result verbatim, alone or as a task's `result`."""
import json

from api.renderers import JSONRenderer
from workers.lifecycle import StoredJSON

TEXT = '[{"row": {"name": "fièvre"}, "results": [{"id": "1"}]}]'


def test_a_stored_answer_is_the_body_as_stored():
    assert JSONRenderer().render(StoredJSON('w', text=TEXT)) == TEXT.encode()


def test_a_stored_result_is_the_tasks_result_as_stored():
    body = JSONRenderer().render({'id': 'a', 'state': 'succeeded', 'result': StoredJSON('w', text=TEXT)})
    assert body == b'{"id":"a","state":"succeeded","result":' + TEXT.encode() + b'}'
    assert json.loads(body)['result'] == json.loads(TEXT)
    assert JSONRenderer().render({'result': StoredJSON('w', text=TEXT)}) == b'{"result":' + TEXT.encode() + b'}'


def test_a_text_in_slices_is_the_same_text():
    assert list(StoredJSON('w', text=TEXT).slices(7)) == [TEXT[i:i + 7] for i in range(0, len(TEXT), 7)]
    assert ''.join(StoredJSON('w', text=TEXT).slices(7)) == TEXT


def test_anything_else_renders_as_drf_renders_it():
    assert JSONRenderer().render({'result': '[1]', 'n': 1}) == b'{"result":"[1]","n":1}'
