from serving.toolcall import check_call, parse_glm

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["path", "start_line"],
        "properties": {"path": {"type": "string"},
                       "start_line": {"type": ["integer", "null"]}}}}},
    {"type": "function", "function": {"name": "submit", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}},
]


def pieces(*parts: str) -> list[bytes]:
    """Markup parts are whole tokens; other parts are split into one token per character."""
    out = []
    for part in parts:
        if part.startswith("<") and part.endswith(">"):
            out.append(part.encode())
        else:
            out += [ch.encode() for ch in part]
    return out


def test_a_call_with_typed_arguments():
    turn = parse_glm(pieces("hi", "<tool_call>", "read_file", "<arg_key>", "path", "</arg_key>",
                            "<arg_value>", "a.py", "</arg_value>", "<arg_key>", "start_line",
                            "</arg_key>", "<arg_value>", "12", "</arg_value>", "</tool_call>"),
                     TOOLS, thinking=False)
    assert turn.content == "hi" and turn.issues == []
    [call] = turn.calls
    assert (call.name, call.arguments, call.valid) == (
        "read_file", {"path": "a.py", "start_line": 12}, True)


def test_reasoning_is_split_off():
    turn = parse_glm(pieces("plan", "</think>", "<tool_call>", "submit", "</tool_call>"), TOOLS,
                     thinking=True)
    assert turn.reasoning == "plan" and turn.calls[0].valid


def test_problems_are_counted_not_raised():
    cut = parse_glm(pieces("<tool_call>", "read_file", "<arg_key>", "path"), TOOLS, False)
    assert cut.calls[0].issues == ["cut_off"]
    unknown = parse_glm(pieces("<tool_call>", "rm", "</tool_call>"), TOOLS, False)
    assert unknown.calls[0].issues == ["unknown_tool"]
    missing = parse_glm(pieces("<tool_call>", "read_file", "</tool_call>"), TOOLS, False)
    assert missing.calls[0].issues == ["missing_argument"]
    wrong = parse_glm(pieces("<tool_call>", "read_file", "<arg_key>", "path", "</arg_key>",
                             "<arg_value>", "a", "</arg_value>", "<arg_key>", "start_line",
                             "</arg_key>", "<arg_value>", "ten", "</arg_value>", "</tool_call>"),
                      TOOLS, False)
    assert wrong.calls[0].issues == ["wrong_type"]


def test_partial_characters_join_before_decoding():
    snowman = "☃".encode()
    turn = parse_glm([b"<tool_call>", b"read_file", b"<arg_key>", b"path", b"</arg_key>",
                      b"<arg_value>", snowman[:1], snowman[1:], b"</arg_value>", b"<arg_key>",
                      b"start_line", b"</arg_key>", b"<arg_value>", b"null", b"</arg_value>",
                      b"</tool_call>"], TOOLS, False)
    assert turn.calls[0].arguments["path"] == "☃"


def test_check_call_on_openai_shaped_calls():
    assert check_call("read_file", '{"path": "a", "start_line": null}', TOOLS) == []
    assert check_call("read_file", "{not json", TOOLS) == ["malformed"]
    assert check_call("read_file", '{"path": "a", "start_line": 1, "x": 1}', TOOLS) == [
        "extra_argument"]
    assert check_call("nope", "{}", TOOLS) == ["unknown_tool"]


def test_the_turn_end_token_is_not_content():
    """Regression: every multi-turn history carried the sampled <|observation|> as the
    assistant's content."""
    turn = parse_glm(pieces("<tool_call>", "submit", "</tool_call>", "<|observation|>"), TOOLS,
                     False)
    assert turn.content == "" and turn.calls[0].valid
    said = parse_glm(pieces("done", "<|user|>"), TOOLS, False)
    assert said.content == "done"


def test_bytes_that_form_no_character_make_the_call_invalid():
    """Regression: a sampled path with a stray byte ran as the path without it."""
    turn = parse_glm([b"<tool_call>", b"read_file", b"<arg_key>", b"path", b"</arg_key>",
                      b"<arg_value>", b"a", b"\xe2\x98", b"b", b"</arg_value>", b"<arg_key>",
                      b"start_line", b"</arg_key>", b"<arg_value>", b"null", b"</arg_value>",
                      b"</tool_call>"], TOOLS, False)
    [call] = turn.calls
    assert "invalid_utf8" in call.issues and not call.valid


def test_markup_inside_a_value_is_read_as_the_grammar_reads_it():
    """A value ends at the </arg_value> after which the call goes on well-formed."""
    turn = parse_glm(pieces("<tool_call>", "read_file", "<arg_key>", "path", "</arg_key>",
                            "<arg_value>", "a", "</arg_value>", "b", "<tool_call>",
                            "</arg_value>", "<arg_key>", "start_line", "</arg_key>",
                            "<arg_value>", "1", "</arg_value>", "</tool_call>"), TOOLS, False)
    [call] = turn.calls
    assert call.arguments == {"path": "a</arg_value>b<tool_call>", "start_line": 1}
    assert call.valid


def test_junk_after_a_value_is_malformed_not_skipped():
    turn = parse_glm(pieces("<tool_call>", "read_file", "<arg_key>", "path", "</arg_key>",
                            "<arg_value>", "a", "</arg_value>", "junk", "</tool_call>"),
                     TOOLS, False)
    assert turn.calls[0].issues[0] == "malformed"


def _parsed(*parts):
    """A turn of token pieces (bytes objects pass as one token each); its one call and what
    the turn read after it."""
    tokens = [p for part in parts for p in ([part] if isinstance(part, bytes) else pieces(part))]
    turn = parse_glm(tokens, TOOLS, False)
    [call] = turn.calls
    return (call.arguments, call.issues), turn.content


def test_a_call_read_loosely_counts_each_problem_and_the_turn_goes_on_after_it():
    """Markup out of order, bytes that form no character in the skipped text or a key, a call
    cut after a key, after a value, or after a value's end: counted, never raised, and what
    follows the call is the turn's again."""
    head = ("<tool_call>", "read_file", "<arg_key>", "path", "</arg_key>")
    value = ("<arg_value>", "a.py", "</arg_value>")
    assert _parsed(*head, "oops", b"\xff", "</tool_call>", "tail") == (
        ({}, ["malformed", "invalid_utf8", "missing_argument"]), "tail")
    assert _parsed(*head, *value, "<arg_key>", "start_line", "</arg_key>", "x", b"\xff",
                   "</tool_call>", "tail") == (
        ({"path": "a.py"}, ["malformed", "invalid_utf8", "missing_argument"]), "tail")
    assert _parsed(*head, *value, "j", b"\xff", "<arg_key>", "start_line", "</arg_key>",
                   "<arg_value>", "3", "</arg_value>", "</tool_call>", "tail") == (
        ({"path": "a.py", "start_line": 3}, ["malformed", "invalid_utf8"]), "tail")
    assert _parsed("<tool_call>", "read_file", "<arg_key>", b"pa\xff", "</arg_key>", "x",
                   b"\xfe", "</tool_call>") == (
        ({}, ["invalid_utf8", "malformed", "missing_argument"]), "")  # counted once
    for cut in (head, (*head, *value), (*head, "<arg_value>")):
        assert _parsed(*cut)[0][1] == ["cut_off"]


def test_a_clean_call_ends_at_its_last_token():
    assert _parsed("<tool_call>", "read_file", "<arg_key>", "path", "</arg_key>",
                   "<arg_value>", "a.py", "</arg_value>", "<arg_key>", "start_line",
                   "</arg_key>", "<arg_value>", "null", "</arg_value>", "</tool_call>",
                   "tail") == (({"path": "a.py", "start_line": None}, []), "tail")


def test_an_openai_shaped_call_with_no_arguments_or_not_an_object():
    assert check_call("submit", "", TOOLS) == []
    assert check_call("read_file", "[1]", TOOLS) == ["malformed"]


def test_a_call_cut_before_its_name_ends_or_named_in_no_characters_is_no_known_tool():
    cut = parse_glm(pieces("<tool_call>", "read"), TOOLS, False).calls[0]
    assert (cut.name, cut.issues) == ("", ["cut_off", "unknown_tool"])
    garbled = parse_glm([b"<tool_call>", b"sub\xff", b"</tool_call>"], TOOLS, False).calls[0]
    assert (garbled.name, garbled.issues) == ("sub\ufffd", ["invalid_utf8", "unknown_tool"])


def test_reasoning_ends_at_the_first_think_end_only_when_thinking():
    thought = parse_glm(pieces("plan", "</think>", "ok"), TOOLS, thinking=True)
    assert (thought.reasoning, thought.content) == ("plan", "ok")
    plain = parse_glm(pieces("plan", "</think>", "ok"), TOOLS, thinking=False)
    assert (plain.reasoning, plain.content) == ("", "plan</think>ok")


def test_content_shows_bytes_of_no_character_as_replacements_and_spelled_markup_is_an_issue():
    turn = parse_glm([b"a", b"\xff", b"<tool", b"_call>"], TOOLS, False)
    assert turn.content == "a\ufffd<tool_call>" and turn.issues == ["subtoken_markup"]
