"""Fernet encryption at rest with MultiFernet key rotation (keys from settings, newest first).

Encryption, rotation and `is_current` use `cryptography`'s Fernet. Decryption, which the
dispatcher does once per delivery, reads the same tokens through a leaner path (`_open`,
`decrypt_many`): the HMAC is checked first (`HmacSha256`, the standard library's, keyed once), then
AES-128-CBC is undone with one reusable AES-ECB context per key and thread plus an XOR with the
previous ciphertext block, which is what CBC decryption is; a claim's tokens share one AES call. It
accepts exactly the tokens MultiFernet accepts (version 0x80, HMAC-SHA256 over version, timestamp,
IV and ciphertext, PKCS7 padding, every configured key tried in full; no TTL) — held to Fernet by
tests/core/test_crypto_open.py.

Why it stays hand-written: it costs a fraction of `MultiFernet.decrypt` a token, a visible share of
the dispatcher's send path, and it wins end to end against graphile-worker by more than the noise
(measured side by side: docs/PERFORMANCE.md, "Hand-written parts").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from django.conf import settings

_BLOCK = 16
_HMAC = 32
_HEAD = 1 + 8 + _BLOCK  # version, timestamp, IV
_local = threading.local()


class DecryptionError(Exception):
    """A stored value could not be decrypted with any configured key."""


@lru_cache(maxsize=4)
def _multifernet(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(k.encode()) for k in keys])


@lru_cache(maxsize=4)
def _primary(keys: tuple[str, ...]) -> Fernet:
    return Fernet(keys[0].encode())


def _keys() -> tuple[str, ...]:
    return tuple(settings.OMNIPOST_ENCRYPTION_KEYS)


def encrypt(plaintext: str) -> str:
    return _multifernet(_keys()).encrypt(plaintext.encode()).decode()


class HmacSha256:
    """HMAC-SHA256 under one key, keyed once: the standard library's HMAC object, copied for each
    message (`hmac.HMAC.copy`) instead of keyed again per call (the webhook signature of every send,
    the token check of every decryption). Side by side: ≈ 1.0 µs a 350-byte message, as fast as
    the hand-keyed SHA-256 states this replaced, against ≈ 1.4 µs for `hmac.new(key, msg, sha256)`."""

    __slots__ = ("_keyed",)

    def __init__(self, key: bytes) -> None:
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def digest(self, *parts: bytes) -> bytes:
        mac = self._keyed.copy()
        for part in parts:
            mac.update(part)
        return mac.digest()


@lru_cache(maxsize=4)
def _opening_keys(keys: tuple[str, ...]) -> tuple[tuple[HmacSha256, bytes], ...]:
    """(signing HMAC, encryption key) per configured key, newest first."""
    pairs = []
    for key in keys:
        raw = base64.urlsafe_b64decode(key)
        pairs.append((HmacSha256(raw[:16]), raw[16:]))
    return tuple(pairs)


_URLSAFE = bytes.maketrans(b"-_", b"+/")


def _ecb(encryption_key: bytes):  # noqa: ANN202 - a cryptography CipherContext
    """A per-thread AES-ECB decryption context (contexts are not thread-safe; ECB keeps no state
    between blocks, so one context serves every token)."""
    contexts = getattr(_local, "contexts", None)
    if contexts is None:
        contexts = _local.contexts = {}
    context = contexts.get(encryption_key)
    if context is None:
        ecb = modes.ECB()  # noqa: S305 - one block at a time; the CBC chaining is done in _open
        context = contexts[encryption_key] = Cipher(algorithms.AES(encryption_key), ecb).decryptor()
    return context


def _token_bytes(token: str) -> bytes | None:
    """A token's bytes if it is base64 of the right shape (version 0x80, whole blocks), else None."""
    try:
        # urlsafe_b64decode, without its two extra copies (base64 is ASCII: a non-ASCII token fails here)
        data = binascii.a2b_base64(token.encode("ascii").translate(_URLSAFE))
    except (AttributeError, UnicodeError, ValueError, binascii.Error):
        return None
    size = len(data) - _HEAD - _HMAC
    if data[:1] != b"\x80" or size < _BLOCK or size % _BLOCK:
        return None
    return data


def _cbc_decrypt(encryption_key: bytes, ciphertext: bytes, chain: bytes) -> bytes:
    """AES-128-CBC decryption of one or many tokens' blocks at once: every block through one AES-ECB
    call, XORed with the block before it in its token (`chain`: each token's IV and all its blocks
    but the last) in one integer operation. Still padded."""
    decrypted = _ecb(encryption_key).update(ciphertext)
    return (int.from_bytes(decrypted, "big") ^ int.from_bytes(chain, "big")).to_bytes(len(ciphertext), "big")


def _unpadded(padded: bytes, start: int, end: int) -> bytes | None:
    """The plaintext in padded[start:end] without its PKCS7 padding; None if the padding is wrong."""
    pad = padded[end - 1]
    if not 1 <= pad <= _BLOCK or padded[end - pad : end] != bytes((pad,)) * pad:
        return None
    return padded[start : end - pad]


def _open(token: str, keys: tuple[str, ...]) -> bytes:
    data = _token_bytes(token)
    if data is None:
        raise InvalidToken
    signed, mac = data[:-_HMAC], data[-_HMAC:]
    # As MultiFernet: every key in turn, in full (HMAC, then decryption and padding), so a key whose
    # signing half matches but whose encryption half does not is passed over, not an error.
    for sign, encryption_key in _opening_keys(keys):
        if not hmac.compare_digest(sign.digest(signed), mac):
            continue
        padded = _cbc_decrypt(encryption_key, data[_HEAD:-_HMAC], data[_HEAD - _BLOCK : -_HMAC - _BLOCK])
        plaintext = _unpadded(padded, 0, len(padded))
        if plaintext is not None:
            return plaintext
    raise InvalidToken


def decrypt_many(tokens: list[str]) -> list[str | None]:
    """Decrypt a batch (the recipients of one claim): tokens under the newest key share one AES
    call and one XOR; None marks a token `decrypt` must be asked about (it raises the error with
    context, or opens a token written under an older key)."""
    sign, encryption_key = _opening_keys(_keys())[0]
    digest, same = sign.digest, hmac.compare_digest
    opened: list[str | None] = [None] * len(tokens)
    index, ciphertexts, chains = [], [], []
    for i, token in enumerate(tokens):
        data = _token_bytes(token)
        if data is None:
            continue
        signed = data[:-_HMAC]
        if not same(digest(signed), data[-_HMAC:]):
            continue
        index.append(i)
        ciphertexts.append(signed[_HEAD:])
        chains.append(signed[_HEAD - _BLOCK : -_BLOCK])
    if not index:
        return opened
    padded = _cbc_decrypt(encryption_key, b"".join(ciphertexts), b"".join(chains))
    start = 0
    for i, ciphertext in zip(index, ciphertexts, strict=True):
        end = start + len(ciphertext)
        plaintext = _unpadded(padded, start, end)
        start = end
        if plaintext is not None:
            try:  # not contextlib.suppress: a context manager per token cost ≈ 1 µs
                opened[i] = plaintext.decode()
            except UnicodeDecodeError:
                pass
    return opened


def decrypt(token: str, *, where: str = "a value") -> str:
    try:
        return _open(token, _keys()).decode()
    except InvalidToken:
        raise DecryptionError(
            f"cannot decrypt {where}: no configured OMNIPOST_ENCRYPTION_KEYS entry matches "
            "(was it encrypted under a key that has since been removed?)"
        ) from None


def is_current(token: str) -> bool:
    """True when the token is already encrypted under the newest key."""
    try:
        _primary(_keys()).decrypt(token.encode())
    except InvalidToken:
        return False
    return True


def rotate(token: str, *, where: str = "a value") -> str:
    try:
        return _multifernet(_keys()).rotate(token.encode()).decode()
    except InvalidToken:
        raise DecryptionError(f"cannot re-encrypt {where}: no configured key matches") from None


# --- blind indexes ------------------------------------------------------------------------------
# A keyed blind index finds a row by an exact value without decrypting the table: HMAC-SHA256 of the
# value under a key derived from each configured Fernet key (HMAC of a fixed label under the key's
# raw bytes, so it is never the Fernet key itself). Rows hold the index under the newest key;
# lookups compute it under every configured key, so a row still indexed under an older key (before
# `rotate_encryption_keys` recomputed it) is found all the same.

_BLIND_LABEL = b"omnipost blind index v1"


@lru_cache(maxsize=4)
def _blind_keys(keys: tuple[str, ...]) -> tuple[HmacSha256, ...]:
    derived = []
    for key in keys:
        raw = base64.urlsafe_b64decode(key)
        derived.append(HmacSha256(hmac.new(raw, _BLIND_LABEL, hashlib.sha256).digest()))
    return tuple(derived)


def blind_index(value: str) -> str:
    """The index of `value` (already normalised by the caller) under the newest key: 64 hex digits."""
    return _blind_keys(_keys())[0].digest(value.encode()).hex()


def blind_indexes(value: str) -> tuple[str, ...]:
    """The index of `value` under every configured key, newest first (what a lookup matches)."""
    data = value.encode()
    return tuple(mac.digest(data).hex() for mac in _blind_keys(_keys()))


def key_count() -> int:
    return len(_keys())


def blind_indexers() -> tuple[object, ...]:
    """The keyed HMAC objects behind `blind_indexes`, newest first, for a caller indexing many values
    in a loop: `hmac.copy()`, `update(value)`, `digest().hex()` per value and key (what
    `blind_indexes` does, without its per-call overhead)."""
    return tuple(mac._keyed for mac in _blind_keys(_keys()))
