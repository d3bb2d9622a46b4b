"""OpenSpiel games as an OpenEnv environment, run in-process (needs ``twinkle[agentic]``).

OpenEnv publishes its OpenSpiel environment (``openspiel_env``) in its source repository, not on
PyPI; this module is the same kind of environment, written against ``openenv-core``'s
``Environment`` interface and ``open-spiel``'s ``pyspiel``, with the same action fields
(``action_id``, ``game_name``, ``game_params``). ``OpenEnv(env_name='openspiel_env')`` uses it
when the ``openspiel_env`` package is not installed.

The agent plays one player; chance nodes (dealt cards) and the other players (``'random'`` or
``'first'`` legal action) are played by the environment, seeded for reproducible episodes.
Observations carry a text for the model: the agent's view of the state (a hidden dealer card
stays hidden) and the legal actions by id and name.
"""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np
import pyspiel
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

OPPONENT_POLICIES = ("random", "first")


class OpenSpielAction(Action):
    """The agent's move: a legal action id of the game."""

    action_id: int
    game_name: str = "catch"
    game_params: dict[str, Any] = {}


class OpenSpielObservation(Observation):
    """What the agent sees after a move (``done`` and ``reward`` come from ``Observation``)."""

    text: str = ""
    legal_actions: list[int] = []
    legal_action_names: list[str] = []
    game_phase: str = "playing"
    current_player_id: int = 0
    opponent_last_action: int | None = None


class OpenSpielState(State):
    """The environment's settings and episode counters."""

    game_name: str = "catch"
    agent_player: int = 0
    opponent_policy: str = "random"
    game_params: dict[str, Any] = {}
    num_players: int = 1


class OpenSpielEnvironment(Environment):
    """One OpenSpiel game, the agent playing ``agent_player``.

    Args:
        game_name: An OpenSpiel game (``'blackjack'``, ``'catch'``, ``'tic_tac_toe'``...).
        agent_player: The player the agent controls.
        opponent_policy: How the other players move: ``'random'`` or ``'first'`` (lowest id).
        game_params: The game's parameters.
        seed: Seed of the chance and opponent moves (``None``: a fresh one per environment).

    Raises:
        ValueError: An unknown game or policy, a simultaneous-move game, or no such player.
    """

    def __init__(
        self,
        game_name: str = "catch",
        agent_player: int = 0,
        opponent_policy: str = "random",
        game_params: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if opponent_policy not in OPPONENT_POLICIES:
            raise ValueError(
                f"opponent_policy must be one of {OPPONENT_POLICIES}, got {opponent_policy!r}"
            )
        try:
            self._game = pyspiel.load_game(game_name, dict(game_params or {}))
        except pyspiel.SpielError as exc:
            raise ValueError(f"cannot load OpenSpiel game {game_name!r}: {exc}") from exc
        kind = self._game.get_type()
        if kind.dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
            raise ValueError(f"{game_name!r} is a simultaneous-move game; only turn-based ones run")
        players = self._game.num_players()
        if not 0 <= agent_player < players:
            raise ValueError(f"agent_player must be in [0, {players}), got {agent_player}")
        self._text_of = _text_view(kind)
        self._rng = np.random.default_rng(seed)
        self._game_state: Any = None
        self._last_opponent_action: int | None = None
        self._state = OpenSpielState(
            game_name=game_name,
            agent_player=agent_player,
            opponent_policy=opponent_policy,
            game_params=dict(game_params or {}),
            num_players=players,
        )

    @property
    def state(self) -> OpenSpielState:
        return self._state

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> OpenSpielObservation:
        """Start a new game and play until it is the agent's turn."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._state.episode_id = episode_id or str(uuid.uuid4())
        self._state.step_count = 0
        self._last_opponent_action = None
        self._game_state = self._game.new_initial_state()
        self._play_others()
        return self._observation(reward=0.0)

    def step(
        self, action: OpenSpielAction, timeout_s: float | None = None, **kwargs: Any
    ) -> OpenSpielObservation:
        """Play the agent's move, then the others' until the agent's next turn.

        Raises:
            RuntimeError: Before ``reset`` or after the game ended.
            ValueError: An action that is not an ``OpenSpielAction``, or an illegal id.
        """
        if not isinstance(action, OpenSpielAction):
            raise ValueError(f"expected an OpenSpielAction, got {type(action).__name__}")
        state = self._game_state
        if state is None or state.is_terminal():
            raise RuntimeError("the game is over (or not started): call reset() first")
        agent = self._state.agent_player
        legal = state.legal_actions(agent)
        if action.action_id not in legal:
            names = _action_names(state, agent, legal)
            raise ValueError(f"action_id {action.action_id} is not legal now; legal: {names}")
        before = state.returns()[agent]
        state.apply_action(action.action_id)
        self._state.step_count += 1
        self._play_others()
        return self._observation(reward=state.returns()[agent] - before)

    def _play_others(self) -> None:
        """Chance and opponent moves until the agent moves next or the game ends."""
        state = self._game_state
        agent = self._state.agent_player
        while not state.is_terminal() and state.current_player() != agent:
            if state.is_chance_node():
                outcomes, probs = zip(*state.chance_outcomes())
                state.apply_action(int(self._rng.choice(outcomes, p=probs)))
                continue
            legal = state.legal_actions()
            if self._state.opponent_policy == "first":
                move = min(legal)
            else:
                move = int(self._rng.choice(legal))
            self._last_opponent_action = move
            state.apply_action(move)

    def _observation(self, reward: float) -> OpenSpielObservation:
        state = self._game_state
        agent = self._state.agent_player
        done = state.is_terminal()
        legal = [] if done else state.legal_actions(agent)
        names = _action_names(state, agent, legal)
        if done:
            text = f"{str(state).rstrip()}\nThe game is over. Your total reward: {state.returns()[agent]:g}."
        else:
            choices = ", ".join(f"{a} = {n}" for a, n in zip(legal, names))
            text = f"{self._text_of(state, agent).rstrip()}\nLegal actions: {choices}."
        return OpenSpielObservation(
            text=text,
            legal_actions=legal,
            legal_action_names=names,
            game_phase="terminal" if done else "playing",
            current_player_id=int(state.current_player()),
            opponent_last_action=self._last_opponent_action,
            done=done,
            reward=float(reward),
        )


def _text_view(kind: Any) -> Any:
    """The agent's view of a state as text: what the game lets that player observe."""
    if kind.provides_observation_string:
        return lambda state, player: state.observation_string(player)
    if kind.provides_information_state_string:
        return lambda state, player: state.information_state_string(player)
    return lambda state, player: str(state)


def _action_names(state: Any, player: int, actions: list[int]) -> list[str]:
    return [state.action_to_string(player, a) for a in actions]
