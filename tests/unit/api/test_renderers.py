"""The API's JSON renderer writes a stored result verbatim, alone or as a task's `result`."""
import json

from api.renderers import JSONRenderer
from workers.lifecycle import StoredJSON

STORED = StoredJSON('[{"row": {"name": "fièvre"}, "results": [{"id": "1"}]}]')


def test_a_stored_answer_is_the_body_as_stored():
    assert JSONRenderer().render(STORED) == STORED.encode()


def test_a_stored_result_is_the_tasks_result_as_stored():
    body = JSONRenderer().render({'id': 'a', 'state': 'succeeded', 'result': STORED})
    assert body == b'{"id":"a","state":"succeeded","result":' + STORED.encode() + b'}'
    assert json.loads(body)['result'] == json.loads(STORED)
    assert JSONRenderer().render({'result': STORED}) == b'{"result":' + STORED.encode() + b'}'


def test_anything_else_renders_as_drf_renders_it():
    assert JSONRenderer().render({'result': '[1]', 'n': 1}) == b'{"result":"[1]","n":1}'
