"""Structured output: GBNF grammars and JSON schemas, enforced exactly under speculation.

    constraint.py   a request's constraint compiled to GBNF and checked before any load
    bounds.py       what a grammar or schema may cost llama.cpp, measured before it sees it
    cache.py        compiled constraints kept under a byte budget
    state.py        one request's grammar state over llama.cpp's grammar engine, and the
                    plain choice, drafting and verification under it
"""
