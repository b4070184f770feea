"""The self-draft measurement's record (edgespec.engine.measure_self writes it) as the
proposers' reader (edgespec.proposers.self_draft_choice) reads it back: ``--proposer self``
uses a measured layer set only when it beat the plain path on a quiet machine."""
from __future__ import annotations

import json

from edgespec.engine.measure_self import candidates, record
from edgespec.proposers.self_draft_choice import FORMAT, Trial, chosen_layers, layers_for, record_path


def test_a_recorded_choice_is_used_only_when_it_beat_plain(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    sha = "ef" * 32
    assert chosen_layers(sha, 28) is None
    assert [c.key for c in candidates(28)] == ["0-3.25-27", "0-4.23-27", "0-6.21-27", "0-8.19-27"]
    slow = Trial("0-6.21-27", 14, 40, 18, tok_s=20.0, plain_tok_s=25.0)
    rec = record(sha, [slow], trusted=True)
    assert rec["chosen"] is None and chosen_layers(sha, 28) is None
    fast = Trial("0-8.19-27", 17, 40, 36, tok_s=30.0, plain_tok_s=25.0)
    assert record(sha, [slow, fast], trusted=False)["chosen"] is None  # a busy machine
    record(sha, [slow, fast], trusted=True)
    assert chosen_layers(sha, 28).key == "0-8.19-27"
    assert chosen_layers(sha, 12) is None  # recorded for another layer count: out of range


def test_an_unreadable_or_foreign_record_falls_back_to_the_default_layers(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    sha = "ab" * 32
    path = record_path(sha)
    path.parent.mkdir(parents=True)
    default = layers_for(sha, 28).key  # half the blocks, the ends kept
    for text in ("{not json", json.dumps({"format": FORMAT + 1, "chosen": "0-3.25-27"}),
                 json.dumps({"format": FORMAT, "chosen": 7})):
        path.write_text(text)
        assert chosen_layers(sha, 28) is None and layers_for(sha, 28).key == default
    path.write_text(json.dumps({"format": FORMAT, "chosen": "0-3.25-27"}))
    assert layers_for(sha, 28).key == "0-3.25-27"
    assert layers_for(sha, 28, "0-9").key == "0-9"  # asked layers win over the record
