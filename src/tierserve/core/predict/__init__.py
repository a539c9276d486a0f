"""Online output-length prediction (torch-free): features, decaying sketches, the predictor and
its state on disk."""

from tierserve.core.predict.predictor import LengthPredictor, Prediction, PredictorConfig
from tierserve.core.predict.store import default_path, load_state, save_state

__all__ = [
    "LengthPredictor",
    "Prediction",
    "PredictorConfig",
    "default_path",
    "load_state",
    "save_state",
]
