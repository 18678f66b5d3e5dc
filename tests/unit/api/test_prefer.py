from api import prefer


def test_respond_async_alone_waits_nothing_and_with_wait_waits_that_long():
    assert prefer.parse('respond-async').seconds(600, 900) == 0
    assert prefer.parse('respond-async, wait=10').seconds(600, 900) == 10
    assert prefer.parse('wait=5000, respond-async').seconds(600, 900) == 900
    assert prefer.parse('').seconds(600, 900) == 600


def test_preference_applied_names_both_when_both_were_honoured():
    both = prefer.parse('respond-async, wait=10')
    assert both.applied(10) == 'respond-async, wait=10'
    assert both.applied(0) == 'respond-async'
    assert prefer.parse('wait=3').applied(3) == 'wait=3'
    assert prefer.parse('wait=3').applied(0) is None
    assert prefer.parse('').applied(600) is None
