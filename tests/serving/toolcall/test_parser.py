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
