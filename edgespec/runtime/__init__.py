"""The llama.cpp boundary: what the installed build is and can do.

    build.py   the build's CMake flags and features against the machine (`edgespec doctor`)
"""
