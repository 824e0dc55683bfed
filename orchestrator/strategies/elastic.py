"""restart.strategy elastic: torchrun's own restart. Each node's torchrun runs with
``--max-restarts`` (restart.max_restarts) and starts its workers again in the job when one fails;
each round of workers is an attempt of the run. The rank task's supervisor (experiments/runtime/
command.py) reports the round's loss and fences the next round itself, so the controller follows it
as it follows warm's coordinator; a failure torchrun did not restart from (its restarts spent, the
job ended, a hang seen from outside) gets a new job, as resubmit."""

from __future__ import annotations

from orchestrator.campaign.strategies import TRAITS, StrategyName
from orchestrator.strategies.warm import Warm


class Elastic(Warm):
    traits = TRAITS[StrategyName.ELASTIC]
