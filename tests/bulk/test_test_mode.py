"""A test key's bulk send is test data: listed and read by test keys only, its notifications test
notifications (sent to the simulator); a live key's job stays live."""

from __future__ import annotations

import pytest

from core.models import ApiKey
from notifications.models import Notification
from tests.bulk.test_api import URL, csv_text, run_all, upload
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def test_a_test_keys_bulk_send_and_its_notifications_are_test_data(tenant_a, api_a, setup_a):
    test_api = client_for(ApiKey.issue(tenant_a, name="test", test=True)[1])
    test_job = upload(test_api, csv_text(3)).json()
    live_job = upload(api_a, csv_text(2)).json()
    assert (test_job["test"], live_job["test"]) == (True, False)
    assert [j["id"] for j in test_api.get(URL).json()["results"]] == [test_job["id"]]
    assert [j["id"] for j in api_a.get(URL).json()["results"]] == [live_job["id"]]
    for api, other in ((api_a, test_job), (test_api, live_job)):
        assert api.get(f"{URL}/{other['id']}").status_code == 404
        assert api.post(f"{URL}/{other['id']}/start").status_code == 404

    assert test_api.post(f"{URL}/{test_job['id']}/start").status_code == 202
    assert api_a.post(f"{URL}/{live_job['id']}/start").status_code == 202
    run_all()
    modes = dict(Notification.objects.values_list("bulk_row", "test").filter(bulk_send_id=test_job["id"]))
    assert modes == {1: True, 2: True, 3: True}
    assert not Notification.objects.filter(bulk_send_id=live_job["id"], test=True).exists()
    page = test_api.get(f"{URL}/{test_job['id']}/notifications").json()["results"]
    assert [(n["row"], n["test"]) for n in page] == [(1, True), (2, True), (3, True)]
