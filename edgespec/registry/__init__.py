"""The model registry: models.toml -> model and pair specs; pulling, digests, GGUF checks.

Every model is a GGUF file assembled from exact PyPI package versions and pinned by size
and sha256. Anywhere a model name is accepted, a path to a local ``.gguf`` file is too.

    models.toml       the shipped registry (package data)
    spec.py           models.toml -> ModelSpec / PairSpec / Registry, validated
    user.py           your own models ($EDGESPEC_HOME/models.toml), layered over the shipped
    toml_write.py     writes the user registry back (tomllib only reads)
    store.py          pulled files, digest stamps, model_status, locks
    pull.py           resolve a name or path; pull, assemble and check a model; verify it
    refs.py           references into other tools' stores: ollama:NAME:TAG, hfcache:, ...
    scan/             those stores on disk (ollama, LM Studio, llama.cpp, the Hugging Face
                      cache): `edgespec models scan`, and resolving a reference to its file
      locations.py      where each store lives; listing.py: listing one store's files
    hub/              Hugging Face Hub references (hf://owner/repo/file.gguf, owner/repo:QUANT)
                      -> a file pulled into its cache, pinned by sha256 at the first pull
      ref.py            parsing references; listing.py: a commit's files, which to fetch
      env.py            huggingface_hub's settings now (endpoint, cache, offline, token)
      download.py       one file into the cache, resuming a partial one another pull left
      pins.py           the digests pinned at first pulls; errors.py: failures -> advice
    qualification.py  per-machine qualification results of any target-proposer pair, keyed
                      by the sha256 of the files measured
    optimize.py       `edgespec models optimize`: a registered copy whose Q6_K tensors are
                      Q8_0 (llama-quantize), recording its source's name and sha256

File locations come from :mod:`edgespec.paths` (``$EDGESPEC_HOME``, default the platform's
user cache dir); ``edgespec_home``/``models_dir`` are re-exported here for callers that
know them as registry functions.
"""
from __future__ import annotations

from ..paths import edgespec_home, models_dir
from .pull import pull, resolve, verify
from .qualification import (model_digest, qualification, qualification_pair, qualification_paths,
                            record_qualification, stale_qualification)
from .spec import (PROPOSER_KINDS, ROLES, SCHEMA, SOURCE_KINDS, ModelSpec, PairSpec, Registry,
                   Source, load_registry, registry_path, shipped_registry_path)
from .store import (Verification, check_gguf, is_path_like, model_path, model_status, sha256_file,
                    spec_file)

__all__ = [
    "PROPOSER_KINDS", "ROLES", "SCHEMA", "SOURCE_KINDS",
    "ModelSpec", "PairSpec", "Registry", "Source", "Verification", "check_gguf", "edgespec_home",
    "is_path_like", "load_registry", "model_digest", "model_path", "model_status", "models_dir",
    "pull", "qualification", "qualification_pair", "qualification_paths", "record_qualification",
    "registry_path", "resolve", "sha256_file", "shipped_registry_path", "spec_file",
    "stale_qualification", "verify",
]
