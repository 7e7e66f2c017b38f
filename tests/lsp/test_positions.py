"""Position conversion between compiler spans (1-based code points) and LSP (0-based, negotiated units)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from lsprotocol import types

from flowc.lsp.positions import UTF8, UTF16, UTF32, LineIndex
from flowc.spans import point

TEXT = "a😀b\nxé😀y\n"


def test_columns_in_each_encoding():
    column_after_emoji = 3  # 1-based code-point column of `y`'s neighbour: "xé😀|y"
    assert LineIndex(TEXT, UTF16).position(2, column_after_emoji + 1).character == 4
    assert LineIndex(TEXT, UTF8).position(2, column_after_emoji + 1).character == 7
    assert LineIndex(TEXT, UTF32).position(2, column_after_emoji + 1).character == 3


def test_crlf_documents_convert_like_lf_ones():
    assert LineIndex("ab\r\ncd", UTF16).offset(types.Position(line=1, character=1)) == 4


def test_positions_past_the_end_clamp():
    index = LineIndex(TEXT, UTF16)
    assert index.offset(types.Position(line=40, character=0)) == len(TEXT)
    assert index.offset(types.Position(line=0, character=99)) == len("a😀b")


@given(st.text(alphabet=st.sampled_from("ab\n😀é"), max_size=30), st.data())
def test_offset_and_position_are_inverse(text, data):
    offset = data.draw(st.integers(min_value=0, max_value=len(text)))
    span = point("f", text, offset)
    for encoding in (UTF8, UTF16, UTF32):
        index = LineIndex(text, encoding)
        assert index.offset(index.position(span.line, span.column)) == offset
