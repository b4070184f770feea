"""RequestStats' draft-tree metrics: branch utilisation, accepted path length, occupancy."""
from edgespec.api.stats import RequestStats


def test_tree_metrics_and_their_record():
    s = RequestStats()
    assert s.branch_utilisation == 0.0 and s.verify_occupancy == (0.0, 0.0)
    s.observe_step(proposer="suffix", drafted=6, accepted=3, emitted=4, draft_seconds=0.0,
                   verify_seconds=0.1, elapsed=0.1)
    s.observe_tree(nodes=6, branches=2, accepted=3, off_first=True)
    s.observe_step(proposer="suffix", drafted=4, accepted=1, emitted=2, draft_seconds=0.0,
                   verify_seconds=0.1, elapsed=0.2)
    s.observe_tree(nodes=4, branches=3, accepted=1, off_first=False)
    assert s.branch_utilisation == 0.5
    assert s.tree_path_length == 2.0
    assert s.verify_occupancy == (5.0, 2.0)
    d = s.to_dict()
    assert d["tree_passes"] == 2 and d["tree_branches"] == 5 and d["branch_utilisation"] == 0.5
    assert d["verify_drafted_per_pass"] == 5.0 and d["verify_accepted_per_pass"] == 2.0
    assert "trees: 2 passes" in s.summary()
    assert "trees:" not in RequestStats().summary()
