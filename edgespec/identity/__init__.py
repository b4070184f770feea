"""The release identity: every component a result depends on, hashed.

    identity.py   the components (models, tokenizers, build, kernel, policy, hardware),
                  their digests and the release hash
    digests.py    a model file's sha256 (cached by path, size and mtime), size and name
"""
