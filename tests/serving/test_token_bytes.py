from serving.tiny_model import ensure_tiny_glm
from serving.token_bytes import TokenBytes


def test_token_bytes_rebuild_split_characters_exactly(tmp_path):
    from tokenizers import Tokenizer

    model = ensure_tiny_glm(tmp_path / "models")
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    table = TokenBytes(tok)
    text = "naïve café — 漢字 ✓ <tool_call>x</tool_call>"
    ids = tok.encode(text, add_special_tokens=False).ids
    pieces = [table[i] for i in ids]
    assert b"".join(pieces) == text.encode()
    # at least one character is split across tokens, which a per-token decode would mangle
    assert any(p.decode("utf-8", errors="replace") != p.decode("utf-8", errors="ignore")
               for p in pieces)
