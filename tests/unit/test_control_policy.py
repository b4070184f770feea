from edgespec.control import AcceptanceModel, Feature
def test_evidence_is_counted_once_across_the_levels():
    m = AcceptanceModel(window=1e9, position_calibration=False)
    m.rescale = False
    f = Feature(("m", 2), 0.35)
    for _ in range(3):
        m.record([f], accepted=1, state=True)
    p = m.predict([f], state=True)[0]
    once = (3 + 6 * 0.35) / (3 + 6)
    assert abs(p - once) < 1e-3, p
