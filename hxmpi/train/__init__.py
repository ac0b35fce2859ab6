"""Training: ``python -m hxmpi.train`` (``command``) runs a ``trainer.Trainer`` on a ``run_config.TrainConfig``.

``update_policy`` decides sync, async or damped updates from the ranks' step times, and
``update_engine`` carries the decision out; ``balance`` splits batches by rank speed; ``optim``
holds SGD and the learning-rate schedules; ``checkpoint``, ``stall`` and ``threads`` keep a run
restartable, watched and within its cores.
"""
