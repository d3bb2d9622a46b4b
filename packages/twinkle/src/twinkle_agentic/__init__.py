"""Agentic RL building blocks that run in the training script's process.

``twinkle_agentic.envs``: environments (``Env``, ``OpenEnv`` for OpenEnv environments embedded
in-process) and ``EnvTool``, which offers an environment's action to the model as a tool.
``twinkle_agentic.tools``: ``Tool`` and ``ToolManager``, which answers the model's tool calls.
``twinkle_client.rollout.ClientMultiTurnRollout`` drives them turn by turn.

Neither subpackage imports torch; ``OpenEnv`` needs the ``agentic`` extra
(``pip install 'twinkle[agentic]'``: ``openenv-core`` and ``open-spiel``).
"""
