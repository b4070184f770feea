"""What the web page's tests share: the model, its second id, the context."""
import os

MODEL = "smollm2-135m"
OTHER = "smol-b"  # the same file served under a second id: a model the page can switch to
CTX = 512  # small, so that an over-context conversation is cheap to build
THREADS = os.environ.get("EDGESPEC_TEST_THREADS", "2")
