"""The release identity: every component a result depends on, hashed.

    identity.py   the components (models, tokenizers, build, kernel, policy, hardware),
                  their digests (edgespec.registry.digests) and the release hash
"""
