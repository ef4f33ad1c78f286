"""The options of each step, where their defaults and accepted values are set once.

`PREPARE_DEFAULTS` (prepare's options), `TrainConfig` (the trainer's), `StreamConfig` (a streamed run's)
and `SynthConfig` (a synthetic graph's) hold the defaults; the tuples name the values an option accepts.
The commands take their flags' defaults from here, so a default is never written twice.

    from diskflow.config import PREPARE_DEFAULTS, TrainConfig

    TrainConfig().hidden            # 128, `diskflow train --hidden`'s default
    PREPARE_DEFAULTS["cpu_memory"]  # "10%"
"""
from __future__ import annotations

from .api import PREPARE_DEFAULTS
from .flow.options import parse_fanouts
from .flow.pipeline import available_pipelines
from .flow.stream.config import StreamConfig
from .operators.ingest.synth import SynthConfig
from .operators.prepare.history import HISTORY_PRUNES, HISTORY_SELECTS, check_prune
from .operators.prepare.seeds import BATCH_ORDERS, GROUPINGS
from .operators.train.config import MODELS, TrainConfig
from .operators.train.modeldef import DATA_ONLY, check_model_option, is_model_file, model_label

__all__ = ["BATCH_ORDERS", "DATA_ONLY", "GROUPINGS", "HISTORY_PRUNES", "HISTORY_SELECTS", "MODELS", "PREPARE_DEFAULTS",
           "StreamConfig", "SynthConfig", "TrainConfig", "available_pipelines", "check_model_option", "check_prune",
           "is_model_file", "model_label", "parse_fanouts"]
