"""The pure pieces of decoding that proposers, grammar, control and the loop build on (the
request loop itself is edgespec.loop, a floor above the proposers).

    sampling.py    logits -> the distribution plain sampling uses (llama.cpp's chain order)
    verify.py      pure acceptance functions on arrays (greedy prefix, rejection sampling,
                   draft trees)
    tree.py        DraftTree and its multi-sequence batch layout
    kvcache.py     prefix reuse: the longest cached token prefix, RAM states of conversations
    textstream.py  UTF-8 across tokens, stop strings across draft boundaries
"""
