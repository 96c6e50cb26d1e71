"""The RL loop: new policy weights mid-run and what a trainer reads.

`Rollouts` (loop.py) is the trainer's API; policy_fence.py and policy_update.py are the
sessions' and the engines' sides of an update; trainer_view.py, behaviour.py and routing.py are
what a trainer reads and recomputes (the records' behaviour logprobs, the grammar masks, the
experts each token was routed to); reinforce.py is the example trainer.
"""
