from edgespec.decoding.textstream import TextAssembler


def feed(asm, pieces):
    out = [asm.push(p) for p in pieces]
    return out


def test_plain_text_passes_through():
    a = TextAssembler()
    assert feed(a, [b"Hel", b"lo"]) == ["Hel", "lo"]
    assert a.flush() == ""


def test_multibyte_character_split_across_tokens():
    snow = "☃".encode()  # 3 bytes
    a = TextAssembler()
    assert feed(a, [snow[:1], snow[1:2], snow[2:] + b"!"]) == ["", "", "☃!"]


def test_stop_string_split_across_tokens_never_leaks():
    a = TextAssembler(["STOP"])
    out = feed(a, [b"ab", b"ST", b"O", b"P", b"tail"])
    assert "".join(out) == "ab"
    assert a.stopped and a.text == "ab"


def test_held_back_prefix_released_when_it_is_not_a_stop():
    a = TextAssembler(["STOP"])
    assert feed(a, [b"x S", b"T"]) == ["x ", ""]
    assert a.push(b"ar") == "STar"
    assert a.flush() == ""


def test_held_back_text_released_at_end():
    a = TextAssembler(["STOP"])
    assert a.push(b"endS") == "end"
    assert a.flush() == "S"


def test_earliest_of_several_stops_wins():
    a = TextAssembler(["world", "lo w"])
    a.push(b"hello world")
    assert a.text == "hel" and a.stopped


def test_invalid_utf8_is_replaced_not_raised():
    a = TextAssembler()
    assert a.push(b"\xff") == "\ufffd"
