"""One request's decoding loop, on the floor above the proposers and the controller that
it drives; the pure pieces it is made of (sampling, verification, trees, the KV cache's
prefixes, text) stay below in edgespec.decoding, which proposers, grammar and control import.

    state.py       what a request (Request) and a pass (Pass, Load) own
    request.py     the loop (Loop): prefill, propose -> decide -> verify -> accept -> emit, in
                   phases (begin, plan, complete, end, release) a scheduler interleaves
    treepass.py    a tree pass in the loop (size, decode over scratch sequences, walk, keep)
"""
