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


def test_a_long_header_is_read_whole():
    padding = ', '.join(f'x-preference-{i}=value-{i}' for i in range(100))  # about 2,800 characters
    assert len(padding) > 1000
    late = prefer.parse(f'{padding}, respond-async, wait=7')
    assert late.respond_async and late.wait == 7
    assert prefer.parse(f'{padding}, respond-async').seconds(600, 900) == 0


def test_a_comma_inside_a_quoted_value_does_not_end_a_preference():
    quoted = prefer.parse('handling=lenient, note="later, respond-async, wait=3"')
    assert not quoted.respond_async and quoted.wait is None
    assert prefer.parse('note="a, b", respond-async').respond_async
