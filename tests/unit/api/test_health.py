def test_healthz_answers_without_authentication(client, db):
    response = client.get('/healthz')
    assert response.status_code == 200
    assert response.json() == {'status': 'ok'}
