"""The load plan: only loopback targets, and tokens, tiers and the mix are checked before anything runs."""
import io
import json

import pytest

from heavy_lanes_client.cli import main
from heavy_lanes_client.load_plan import Account, parse_mix, parse_token_arg, read_accounts, require_loopback


def test_only_loopback_addresses_are_load_tested():
    for url in ('http://127.0.0.1:8000', 'http://127.1.2.3', 'http://localhost:8000/', 'http://[::1]:8000'):
        assert require_loopback(url) == url
    for url in ('http://10.0.0.5:8000', 'http://192.168.1.2', 'https://example.org', 'ftp://127.0.0.1'):
        with pytest.raises(ValueError):
            require_loopback(url)
    with pytest.raises(SystemExit) as ex:
        main(['load', '--url', 'http://10.0.0.5:8000', '--token', 'core:x'], out=io.StringIO(),
             err=io.StringIO())
    assert ex.value.code == 2


def test_tokens_tiers_and_mix_are_checked(tmp_path):
    path = tmp_path / 'tokens.json'
    path.write_text(json.dumps({'tokens': [{'token': 'a', 'tier': 'core'},
                                           {'token': 'b', 'tier': 'preview'}]}))
    assert read_accounts(path) == [Account('core', 'a'), Account('preview', 'b')]
    assert parse_token_arg('early_access:k:with:colons') == Account('early_access', 'k:with:colons')
    with pytest.raises(ValueError):
        parse_token_arg('gold:abc')
    with pytest.raises(ValueError):
        parse_mix('single=1,huge=2')
    assert parse_mix('single=2,rerank=0') == (('single', 2.0), ('rerank', 0.0))
