"""core.http.h2wire's stateless HPACK encoder, read back by hpack's own decoder (RFC 7541)."""

from __future__ import annotations

from hpack import Decoder

from core.http.h2wire import Encoder as _Encoder

HEADERS = [
    (b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"api.push.apple.com"),
    (b":path", b"/3/device/" + b"a1" * 32), (b"authorization", b"bearer " + b"x" * 300),
    (b"apns-topic", b"com.example.app"), (b"content-length", b"123"), (b"x" * 200, b"y" * 20_000),
]  # fmt: skip


def test_every_block_decodes_to_the_headers_and_leaves_the_decoder_table_empty():
    encoder, decoder = _Encoder(), Decoder()
    first = encoder.encode(HEADERS)
    assert first[0] == 0x20  # a table size update to 0 opens the first block
    for block, headers in (
        (first, HEADERS),
        (encoder.encode(HEADERS), HEADERS),
        (encoder.encode(HEADERS[:3]), HEADERS[:3]),
    ):
        assert decoder.decode(block, raw=True) == headers
    assert len(decoder.header_table.dynamic_entries) == 0
    assert encoder.encode([(b":method", b"POST")]) == b"\x83"  # static table index 3
    encoder.resize = True  # the peer changed SETTINGS_HEADER_TABLE_SIZE: signalled again
    block = encoder.encode(HEADERS)
    assert block[0] == 0x20 and decoder.decode(block, raw=True) == HEADERS


def test_credentials_are_never_indexed():
    block = _Encoder().encode([(b"authorization", b"bearer t")])
    assert block[1] & 0xF0 == 0x10  # literal never indexed (RFC 7541 §6.2.3)
    decoded = Decoder().decode(block, raw=True)
    assert decoded == [(b"authorization", b"bearer t")] and decoded[0].indexable is False
