"""Hermetic stand-ins for the engine's collaborators: no llama.cpp, no pulled models.

    from fakes import FakeModel, ScriptedProposer, fake_engine, fixed
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [3, (1, 2)])}, control=fixed(3))
    r = eng.generate("abc", GenerationParams(max_tokens=12, chat=False))
"""
from .backend import (BOS, EOG, EOS, EOT, N_VOCAB, PIECES, Decode, FakeContext, FakeModel,
                      KVMismatch, Trim)
from .engine import CALIBRATION, fake_engine, fixed
from .proposers import ScriptedProposer, ScriptedSession, wrong_token

__all__ = ["BOS", "CALIBRATION", "Decode", "EOG", "EOS", "EOT", "FakeContext", "FakeModel",
           "KVMismatch", "N_VOCAB", "PIECES", "ScriptedProposer", "ScriptedSession", "Trim",
           "fake_engine", "fixed", "wrong_token"]
