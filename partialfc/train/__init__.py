"""Training: typed YAML config, the engine (DDP backbone + any loss head), checkpoints.

* :mod:`partialfc.train.config` — the schema, ``load_config(path, overrides)``
* :mod:`partialfc.train.engine` — :class:`Trainer` (``Trainer(cfg).fit()``)
* :mod:`partialfc.train.extra_losses` — extra loss terms (``StepContext`` → ``LossTerm``), triplet
* :mod:`partialfc.train.lr_schedule` — warm-up + poly / step learning-rate factors
* :mod:`partialfc.train.checkpoint` — atomic checkpoints, ``load_backbone_from_checkpoint``
* :mod:`partialfc.train.builders` — config sections → backbone, head (``head.kind``), optimizers
* :mod:`partialfc.train.evaluation` — verification through :mod:`partialfc.eval`
* :mod:`partialfc.train.command` — ``partialfc train``

Imports are lazy (``from partialfc.train.engine import Trainer``) so that ``partialfc --help``
and the deployment code do not pay for the training stack.
"""
