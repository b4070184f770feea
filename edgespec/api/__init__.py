"""What callers hand an engine and what it hands back: plain values, no edgespec behaviour.

    labels.py   PLAIN / AUTO, stop reasons, control event kinds, canary arms (Literal types)
    arrays.py   FloatArray: the logits and probability rows the typed seams pass
    params.py   GenerationParams / SamplingParams with named guards (refused before any load)
    events.py   the typed event stream (RequestStarted, PrefillDone, Step, Control, Finished)
    stats.py    RequestStats (one definition of decode rate, TTFT, acceptance) and sinks
"""
