"""Queue names are tenant input (issue 19, item 4): their pattern and length are checked, and
`OMNIPOST_MAX_QUEUES_PER_TENANT` bounds how many distinct ones a tenant's notifications use."""

from __future__ import annotations

import pytest

from notifications import services
from notifications.models import Notification, TenantQueue
from queueing.models import QueueItem
from tests.support.setups import email

pytestmark = pytest.mark.django_db
URL = "/api/v1/notifications"
BATCH = "/api/v1/notifications/batch"


@pytest.fixture
def cap_3(settings):
    settings.OMNIPOST_MAX_QUEUES_PER_TENANT = 3
    services._KNOWN_QUEUES.clear()


def post(client, body, url=URL):  # noqa: ANN001, ANN201
    return client.post(url, body, format="json")


@pytest.mark.parametrize("name", ["no spaces", "x" * 65, "-leading", "a/b", "é", "a,b", ""])
def test_bad_queue_names_are_400(api_a, setup_a, name):
    response = post(api_a, email(queue=name))
    assert response.status_code == 400 and "queue" in response.json()["error"]["details"]


def test_a_new_queue_past_the_cap_is_400_and_known_ones_stay_open(api_a, setup_a, cap_3):
    for name in ("q1", "q2", "q3"):
        assert post(api_a, email(queue=name)).status_code == 201
    refused = post(api_a, email(queue="q4"))
    assert refused.status_code == 400, refused.content
    [message] = refused.json()["error"]["details"]["queue"]
    assert "already uses 3 queues, the most allowed is 3" in message
    for name in ("q1", "q2", "q3", "default"):  # `default` is always there and not counted
        assert post(api_a, email(queue=name)).status_code == 201
    assert set(TenantQueue.objects.values_list("name", flat=True)) == {"q1", "q2", "q3"}
    assert not Notification.objects.filter(queue="q4").exists() and not QueueItem.objects.filter(queue_name="q4")


def test_a_batch_gets_as_many_new_queues_as_there_is_room_for(api_a, setup_a, cap_3):
    assert post(api_a, email(queue="q1")).status_code == 201
    body = {"notifications": [email(queue=q) for q in ("q1", "q2", "q3", "q4", "q5")]}
    response = post(api_a, body, BATCH)
    assert response.status_code == 400
    assert sorted(response.json()["error"]["details"]["notifications"]) == ["3", "4"]
    assert post(api_a, {"notifications": [email(queue=q) for q in ("q1", "q2", "q3")]}, BATCH).status_code == 201
    assert TenantQueue.objects.count() == 3


def test_the_cap_is_per_tenant(api_a, api_b, setup_a, setup_b, cap_3):
    for name in ("a1", "a2", "a3"):
        assert post(api_a, email(queue=name)).status_code == 201
    for name in ("b1", "b2", "b3"):
        assert post(api_b, email(queue=name)).status_code == 201
    assert post(api_b, email(queue="a1")).status_code == 400


def test_the_cap_is_read_from_the_database_not_only_this_process(api_a, setup_a, cap_3):
    for name in ("q1", "q2", "q3"):
        assert post(api_a, email(queue=name)).status_code == 201
    services._KNOWN_QUEUES.clear()  # another process: it knows nothing yet
    assert post(api_a, email(queue="q4")).status_code == 400
    assert post(api_a, email(queue="q2")).status_code == 201


def test_known_queues_cost_no_query(api_a, setup_a, cap_3, django_assert_max_num_queries,
                                    django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):  # this process learns the name once committed
        post(api_a, email(queue="q1"))
    with django_assert_max_num_queries(0):
        assert services._queues_past_the_cap(setup_a.tenant, {"q1", "default"}) == {}
