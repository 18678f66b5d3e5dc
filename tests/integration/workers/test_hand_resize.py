"""A hand resize racing a config change: the limit ends at one number someone asked for, never their sum.

Flower's grow of an es2_knn node from 2 to 3 (es2_knn 3 -> 4) raced `PATCH es2_knn=5` and ended at 6: the
node added its +1 to the PATCH's 5. These drive workers.hand_resize.adopt with the database and Redis the
reconciler gives it; test_operations has the same race through a real Flower and worker."""
import pytest

from capacity.config import Superseded, get_current, save_config
from capacity.constants import SOURCE_FLOWER
from workers import hand_resize

pytestmark = pytest.mark.django_db


def es2_knn():
    return get_current()[1].to_json()['es2_knn']


def test_a_hand_resize_with_nothing_newer_becomes_the_limit(redis_client):
    _, sized_from = get_current()  # es2_knn 3: pool 2 on the one node
    assert hand_resize.adopt(redis_client, 'es2_knn', 'knn@a', 2, 3, sized_from=sized_from) == hand_resize.SAVED
    assert es2_knn() == 4


def test_a_config_change_saved_after_the_node_was_sized_supersedes_its_hand_resize(redis_client):
    _, sized_from = get_current()
    save_config({'es2_knn': 5}, note='more kNN')  # the PATCH, before the reconciler saw the grow

    outcome = hand_resize.adopt(redis_client, 'es2_knn', 'knn@a', 2, 3, sized_from=sized_from)

    assert outcome == hand_resize.SUPERSEDED
    assert es2_knn() == 5  # what the PATCH asked, not 6
    assert get_current()[0].source == 'api'


def test_a_change_that_left_the_queue_alone_supersedes_nothing(redis_client):
    _, sized_from = get_current()
    save_config({'tiers': {'preview': 1}}, note='another lane')
    assert hand_resize.adopt(redis_client, 'es2_knn', 'knn@a', 2, 3, sized_from=sized_from) == hand_resize.SAVED
    assert es2_knn() == 4


def test_another_nodes_adopted_hand_resize_adds_up_with_this_one(redis_client):
    _, sized_from = get_current()
    assert hand_resize.adopt(redis_client, 'es2_knn', 'knn@b', 1, 2, sized_from=sized_from) == hand_resize.SAVED
    assert get_current()[0].source == SOURCE_FLOWER
    assert hand_resize.adopt(redis_client, 'es2_knn', 'knn@a', 1, 2, sized_from=sized_from) == hand_resize.SAVED
    assert es2_knn() == 5  # 3 + 1 + 1: both grows


def test_a_change_based_on_an_older_version_is_refused_whoever_saved_in_between():
    row, _, _ = save_config({'es2_knn': 4})
    save_config({'es2_knn': 5})
    with pytest.raises(Superseded):
        save_config({'es2_knn': 6}, source=SOURCE_FLOWER, based_on=row.id)
    assert es2_knn() == 5
    latest, _ = get_current()
    save_config({'es2_knn': 6}, source=SOURCE_FLOWER, based_on=latest.id)
    assert es2_knn() == 6


def test_a_first_change_can_be_based_on_no_version():
    assert get_current()[0] is None
    save_config({'es2_knn': 4}, based_on=None)
    with pytest.raises(Superseded):
        save_config({'es2_knn': 6}, based_on=None)
    assert es2_knn() == 4
