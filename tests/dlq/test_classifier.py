"""The classifier's table: every status class and exception kind."""

from __future__ import annotations

import logging

import pytest

from core.http import HttpConnectError, HttpDnsError, HttpTimeout, HttpTlsError
from dlq.classifier import Classification, classify
from providers.kinds.base import DeliveryResult, result_from_exception
from providers.ssrf import DestinationForbidden


def failed(**kw) -> DeliveryResult:
    return DeliveryResult(delivered=False, **kw)


CASES = [
    # (result, outcome, failure_class, error_code)
    (DeliveryResult(delivered=True, http_status=200), "delivered", "", ""),
    (DeliveryResult(delivered=True, http_status=204), "delivered", "", ""),
    (DeliveryResult(delivered=True), "delivered", "", ""),
    # 3xx
    (failed(http_status=301), "permanent_error", "permanent", "http_301"),
    (failed(http_status=302, error_code="redirect", permanent=True), "permanent_error", "permanent", "redirect"),
    (failed(http_status=304), "permanent_error", "permanent", "http_304"),
    # 4xx
    (failed(http_status=400, error_code="http_400"), "permanent_error", "permanent", "http_400"),
    (failed(http_status=401, error_code="http_401"), "permanent_error", "permanent", "http_401"),
    (failed(http_status=403, error_code="http_403"), "permanent_error", "permanent", "http_403"),
    (failed(http_status=404, error_code="http_404"), "permanent_error", "permanent", "http_404"),
    (failed(http_status=413, error_code="http_413"), "permanent_error", "permanent", "http_413"),
    (failed(http_status=422, error_code="http_422"), "permanent_error", "permanent", "http_422"),
    (failed(http_status=408, error_code="http_408"), "transient_error", "transient", "http_408"),
    (failed(http_status=425, error_code="http_425"), "transient_error", "transient", "http_425"),
    (failed(http_status=429, error_code="http_429"), "transient_error", "transient", "http_429"),
    # 5xx
    (failed(http_status=500, error_code="http_500"), "transient_error", "transient", "http_500"),
    (failed(http_status=502), "transient_error", "transient", "http_502"),
    (failed(http_status=503, error_code="http_503"), "transient_error", "transient", "http_503"),
    (failed(http_status=504, error_code="http_504"), "transient_error", "transient", "http_504"),
    # provider-specific codes with a status: the status decides
    (failed(http_status=400, error_code="twilio_21606"), "permanent_error", "permanent", "twilio_21606"),
    (failed(http_status=429, error_code="twilio_20429"), "transient_error", "transient", "twilio_20429"),
    # network-level failures
    (failed(error_code="timeout", error_class="HttpTimeout"), "transient_error", "transient", "timeout"),
    (
        failed(error_code="connect_error", error_class="HttpConnectError"),
        "transient_error",
        "transient",
        "connect_error",
    ),
    (failed(error_code="dns_error", error_class="HttpDnsError"), "transient_error", "transient", "dns_error"),
    (failed(error_code="tls_error", error_class="HttpTlsError"), "transient_error", "transient", "tls_error"),
    (failed(error_code="protocol_error"), "transient_error", "transient", "protocol_error"),
    # permanent whatever the transport says
    (failed(error_code="destination_forbidden"), "permanent_error", "permanent", "destination_forbidden"),
    (failed(error_code="invalid_recipient"), "permanent_error", "permanent", "invalid_recipient"),
    (failed(error_code="invalid_recipient", http_status=400), "permanent_error", "permanent", "invalid_recipient"),
    (failed(error_code="malformed_content"), "permanent_error", "permanent", "malformed_content"),
    (failed(error_code="redirect"), "permanent_error", "permanent", "redirect"),
    # SMTP reply codes
    (failed(error_code="smtp_550"), "permanent_error", "permanent", "smtp_550"),
    (failed(error_code="smtp_554"), "permanent_error", "permanent", "smtp_554"),
    (failed(error_code="smtp_421"), "transient_error", "transient", "smtp_421"),
    (failed(error_code="smtp_451"), "transient_error", "transient", "smtp_451"),
    # the provider's hint wins
    (failed(error_code="smtp_451", permanent=True), "permanent_error", "permanent", "smtp_451"),
    (failed(http_status=404, error_code="http_404", permanent=False), "transient_error", "transient", "http_404"),
    (
        failed(error_code="destination_forbidden", permanent=False),
        "transient_error",
        "transient",
        "destination_forbidden",
    ),
]


@pytest.mark.parametrize(("result", "outcome", "failure_class", "code"), CASES)
def test_classification_table(result, outcome, failure_class, code):
    verdict = classify(result)
    assert isinstance(verdict, Classification)
    assert (verdict.outcome, verdict.failure_class, verdict.error_code) == (outcome, failure_class, code)
    assert verdict.delivered is (outcome == "delivered")
    assert verdict.permanent is (failure_class == "permanent")


@pytest.mark.parametrize(
    ("exc", "code", "failure_class"),
    [
        (HttpTimeout("slow"), "timeout", "transient"),
        (TimeoutError(), "timeout", "transient"),
        (HttpConnectError("refused"), "connect_error", "transient"),
        (ConnectionRefusedError(111, "Connection refused"), "connect_error", "transient"),
        (ConnectionResetError(104, "reset"), "connect_error", "transient"),
        (HttpDnsError("nxdomain"), "dns_error", "transient"),
        (__import__("socket").gaierror(-2, "Name or service not known"), "dns_error", "transient"),
        (HttpTlsError("bad cert"), "tls_error", "transient"),
        (__import__("ssl").SSLCertVerificationError(1, "certificate verify failed"), "tls_error", "transient"),
        (DestinationForbidden("meta", "169.254.169.254"), "destination_forbidden", "permanent"),
    ],
)
def test_exceptions_map_to_stable_codes(exc, code, failure_class):
    result = result_from_exception(exc)
    assert result.delivered is False and result.error_class == type(exc).__name__
    verdict = classify(result)
    assert (verdict.error_code, verdict.failure_class) == (code, failure_class)


def test_unknown_exception_is_transient_and_logged_loudly(caplog):
    result = result_from_exception(KeyError("boom"))
    with caplog.at_level(logging.ERROR, logger="omnipost.delivery"):
        verdict = classify(result)
    assert (verdict.outcome, verdict.failure_class, verdict.error_code) == (
        "transient_error",
        "transient",
        "unexpected_error",
    )
    [record] = caplog.records
    assert record.levelno == logging.ERROR and "KeyError" in record.getMessage()


def test_unknown_status_is_transient_and_logged(caplog):
    with caplog.at_level(logging.ERROR, logger="omnipost.delivery"):
        verdict = classify(failed(http_status=999))
    assert verdict.failure_class == "transient" and caplog.records


def test_retry_after_is_carried_for_transient_failures_only():
    assert classify(failed(http_status=429, retry_after=30.0)).retry_after == 30.0
    assert classify(failed(http_status=400, retry_after=30.0)).retry_after is None
    assert classify(DeliveryResult(delivered=True, retry_after=5.0)).retry_after is None


def test_exception_messages_are_masked_and_secret_free():
    result = result_from_exception(
        ValueError("rejected jane.doe@example.com with key whsec_c2VjcmV0c2VjcmV0 and token tok-123456"),
        secrets=["tok-123456"],
    )
    assert "jane.doe@example.com" not in result.message and "c2VjcmV0" not in result.message
    assert "tok-123456" not in result.message
