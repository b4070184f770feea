"""What the server tests share: the model, the flags, the key."""
import os

MODEL = "smollm2-135m"
FIM_MODEL = "qwen-0.5b"  # has fill-in-the-middle tokens and a tool template
THREADS = os.environ.get("EDGESPEC_TEST_THREADS", "2")
API_KEY = "test-key-7f3a"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # a prompt that continues as long as allowed


def base_args(*extra: str) -> list[str]:
    return ["--target", MODEL, "--ctx", "1024", "--threads", THREADS, *extra]
