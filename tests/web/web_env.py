"""What the web page's tests share: the model, its second id, the context."""
import os

MODEL = "smollm2-135m"
OTHER = "smol-b"  # the same file served under a second id: a model the page can switch to
CTX = 512  # small, so that an over-context conversation is cheap to build
# one thread unless told otherwise: the browser needs the other core, and llama.cpp's
# threads wait on each other when a core is taken (48 tokens took 9-19 s with two on a busy
# 2-core machine, 1-2 s with one)
THREADS = os.environ.get("EDGESPEC_TEST_THREADS", "1")
