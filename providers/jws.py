"""Compact JWS (RFC 7515) signing for the push vendors' tokens, with `cryptography` directly: ES256
(APNs provider tokens, VAPID) and RS256 (the OAuth JWT-bearer assertion of an FCM service account).
A token is made once and reused for its lifetime (the providers cache them), so this is cold code."""

from __future__ import annotations

import base64
import json
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signing_input(header: dict[str, Any], claims: dict[str, Any]) -> bytes:
    dump = lambda value: b64url(json.dumps(value, separators=(",", ":")).encode())  # noqa: E731
    return f"{dump(header)}.{dump(claims)}".encode("ascii")


def es256(key: ec.EllipticCurvePrivateKey, claims: dict[str, Any], **header: Any) -> str:
    """A JWS signed ES256: the signature is r‖s, 32 bytes each (RFC 7518 §3.4), not DER."""
    signing_input = _signing_input({"alg": "ES256", "typ": "JWT", **header}, claims)
    r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
    return f"{signing_input.decode()}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def rs256(key: rsa.RSAPrivateKey, claims: dict[str, Any], **header: Any) -> str:
    signing_input = _signing_input({"alg": "RS256", "typ": "JWT", **header}, claims)
    signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input.decode()}.{b64url(signature)}"


def load_p256_private_key(text: str) -> ec.EllipticCurvePrivateKey:
    """A P-256 private key from PEM (PKCS#8 as in an APNs .p8, or SEC1) or from the base64url of its
    raw 32-byte scalar (how VAPID keys are usually shown); ValueError otherwise."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError("not a readable unencrypted PEM private key") from exc
    else:
        try:
            raw = b64url_decode(text)
        except (ValueError, TypeError):
            raise ValueError("neither PEM nor base64url") from None
        if len(raw) != 32:
            raise ValueError("a raw P-256 private key is 32 bytes (base64url)")
        try:
            key = ec.derive_private_key(int.from_bytes(raw, "big"), ec.SECP256R1())
        except ValueError as exc:
            raise ValueError("not a valid P-256 scalar") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("must be an EC key on the P-256 curve")
    return key


def load_rsa_private_key(pem: str, *, checked: bool = False) -> rsa.RSAPrivateKey:
    """The RSA key of `pem`. OpenSSL checks the key's numbers (primes, exponents: ~37 ms for 2048 bits,
    most of what building an FCM provider costs) unless `checked` says that a load with the check has
    already accepted this very text (when it was saved), so the check is skipped."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None, unsafe_skip_rsa_key_validation=checked)
    except (ValueError, TypeError) as exc:
        raise ValueError("not a readable unencrypted PEM private key") from exc
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError("must be an RSA key")
    return key


def uncompressed_point(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
