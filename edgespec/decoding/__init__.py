"""One request's decoding loop and the pure pieces it is made of.

    request.py     the loop: prefill, propose -> decide -> verify -> accept -> emit, in
                   phases (begin, plan, complete, end, release) a scheduler interleaves
    sampling.py    logits -> the distribution plain sampling uses (llama.cpp's chain order)
    verify.py      pure acceptance functions on arrays (greedy prefix, rejection sampling,
                   draft trees)
    tree.py        DraftTree and its multi-sequence batch layout
    treepass.py    a tree pass in the loop (size, decode over scratch sequences, walk, keep)
    kvcache.py     prefix reuse: the longest cached token prefix, RAM states of conversations
    textstream.py  UTF-8 across tokens, stop strings across draft boundaries
"""
