"""What the SES tests over real HTTP share: the SES and SNS stand-ins, the web process that trusts the
SNS stand-in's certificates, and a post shaped as SNS posts."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.support import web
from tests.support.aws import SesStandIn, SnsStandIn

KEY_ID, SECRET, REGION = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "eu-west-1"
ADDRESS = "jane.doe@example.com"


@pytest.fixture
def ses() -> Iterator[SesStandIn]:
    with SesStandIn(access_key_id=KEY_ID, secret_access_key=SECRET, region=REGION) as standin:
        yield standin


@pytest.fixture
def sns() -> Iterator[SnsStandIn]:
    with SnsStandIn() as standin:
        yield standin


@pytest.fixture
def server(subprocess_env: dict[str, str], sns: SnsStandIn) -> Iterator[str]:
    env = {
        **subprocess_env,
        "OMNIPOST_SNS_CERT_URL_PATTERN": sns.cert_url_pattern,
        "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS": "true",
    }
    with web.gunicorn(env) as served:
        yield served.url


def sns_post(url: str, message: dict) -> httpx.Response:
    """As SNS posts: the JSON message as text/plain, its type in x-amz-sns-message-type."""
    headers = {
        "Content-Type": "text/plain; charset=UTF-8",
        "x-amz-sns-message-type": message["Type"],
        "x-amz-sns-message-id": message["MessageId"],
        "x-amz-sns-topic-arn": message["TopicArn"],
        "User-Agent": "Amazon Simple Notification Service Agent",
    }
    return httpx.post(url, content=json.dumps(message).encode(), headers=headers, timeout=10)
