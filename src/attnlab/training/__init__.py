"""The training engine shared by every task: schedules, checkpoints, DDP, the loop."""

from attnlab.training.engine import Batch, Task, TrainConfig, Trainer, TrainingError, TrainResult, seed_everything
from attnlab.training.schedules import Schedule

__all__ = ["Batch", "Task", "TrainConfig", "Trainer", "TrainingError", "TrainResult", "Schedule", "seed_everything"]
