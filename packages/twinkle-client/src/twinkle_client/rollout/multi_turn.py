"""``ClientMultiTurnRollout``: sample -> tool call -> observation -> sample, over HTTP."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twinkle_client.rollout._bridge import bridge_token_ids
from twinkle_client.rollout._episode import Episode
from twinkle_client.rollout._result import RolloutTrajectory
from twinkle_client.rollout._tool_calls import parse_tool_calls
from twinkle_client.sampler.types import SamplingParams


class ClientMultiTurnRollout:
    """Multi-turn agentic rollouts driven from the client: the model samples on the server, tools
    and environments run here.

    Each round makes one ``sampler.sample`` call for every trajectory still running. A
    completion's tool calls (Qwen's ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``)
    go to that trajectory's tool manager; each result becomes a ``tool`` message, and the
    template's text for it plus the next generation prompt is appended, untrained, to the
    trajectory's tokens. A trajectory ends when a completion calls no tool, when its tool
    manager reports ``done`` (the environment's episode is over), when a completion is cut at
    ``max_tokens``, at ``max_turns`` completions, or when the next prompt would pass the
    template's ``max_length``.

    The template is only called (``encode``, ``render``, ``decode``, ``eos_token_id``,
    ``tokenizer.encode``), so this module needs no torch.

    Args:
        sampler: A ``twinkle_client`` sampler (anything with
            ``sample(inputs, sampling_params=...)``).
        template: The chat template the policy is trained with, e.g.
            ``twinkle.template.Qwen3_5Template(model_id=..., enable_thinking=False)``.
        tool_manager: Default tool manager(s): one for all trajectories, or one per trajectory.
            A tool manager is called with an OpenAI-style tool call dict and returns the result
            text; its ``done`` attribute, when true, ends the trajectory.
        sampling_params: How to sample each turn (``SamplingParams``, a dict, or an object with
            its field names); ``num_samples`` must be 1.
        max_turns: Most completions per trajectory.
        max_trajectory_tokens: End a trajectory once it holds this many tokens.
        adapter_name: Sample with this adapter of the sampler (``sampler.sample``'s
            ``adapter_name``); ``None`` samples with what the sampler uses by default.
        adapter_uri: Sample with this checkpoint or live adapter (``sampler.sample``'s
            ``adapter_uri``, e.g. what ``sampler.load_adapter_from_model(model)`` returns).
            Both are attributes too: set a new one after each training step.

    Raises:
        ValueError: ``max_turns < 1``, ``max_trajectory_tokens < 1``, ``num_samples != 1``, or no
            template.
    """

    def __init__(
        self,
        sampler: Any,
        template: Any,
        tool_manager: Any = None,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        max_turns: int = 6,
        max_trajectory_tokens: int | None = None,
        adapter_name: str | None = None,
        adapter_uri: str | None = None,
    ) -> None:
        if template is None:
            raise ValueError("template is required: the rollout tokenises the conversation itself")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if max_trajectory_tokens is not None and max_trajectory_tokens < 1:
            raise ValueError(f"max_trajectory_tokens must be >= 1, got {max_trajectory_tokens!r}")
        self.sampler = sampler
        self.template = template
        self.tool_manager = tool_manager
        self.sampling_params = _single_sample(sampling_params)
        self.max_turns = max_turns
        self.max_trajectory_tokens = max_trajectory_tokens
        self.adapter_name = adapter_name
        self.adapter_uri = adapter_uri

    def __call__(
        self,
        trajectories: Sequence[Mapping[str, Any]],
        tool_manager: Any = None,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
    ) -> list[RolloutTrajectory]:
        """Roll out every trajectory.

        Args:
            trajectories: Trajectories (dicts or ``Trajectory``) with ``messages`` and optional
                ``tools``.
            tool_manager: Overrides the constructor's: one for all, or a list with one per
                trajectory.
            sampling_params: Overrides the constructor's.

        Returns:
            One :class:`RolloutTrajectory` per trajectory, in order, ready for
            ``model.forward_backward(inputs=...)``. Its training fields: ``input_ids``, ``labels``
            (``-100`` everywhere but the sampled tokens) and, with log-probs, ``old_logprobs``
            (each sampled token's at its position, 0 elsewhere). Read by key as well: the
            trajectory's own fields, ``messages`` (with the assistant and tool turns appended),
            ``logprobs`` (one per sampled token, each a float that also reads as
            ``(token_id, logprob)`` pairs: ``lp[0][1]``; ``None`` without log-probs), ``turns``
            (completions sampled), ``stop_reason`` (the last completion's, ``'env_done'`` when
            the environment ended the episode, or ``'max_turns'``) and ``truncated``.

        Raises:
            TypeError: A single trajectory instead of a list.
            ValueError: A tool call in a trajectory that has no tool manager, a list of tool
                managers of another length, or a prompt longer than the template's
                ``max_length``.
            RuntimeError: The sampler returned not one log-prob per token.
        """
        if isinstance(trajectories, Mapping) or hasattr(trajectories, "messages"):
            raise TypeError("trajectories must be a list; wrap a single one as [trajectory]")
        trajectories = list(trajectories)
        params = (
            self.sampling_params if sampling_params is None else _single_sample(sampling_params)
        )
        managers = _per_trajectory(
            self.tool_manager if tool_manager is None else tool_manager, len(trajectories)
        )
        episodes = [self._start(i, t) for i, t in enumerate(trajectories)]
        for _ in range(self.max_turns):
            running = [i for i, episode in enumerate(episodes) if not episode.done]
            if not running:
                break
            inputs = [{"input_ids": episodes[i].input_ids} for i in running]
            response = self.sampler.sample(inputs, sampling_params=params, **self._adapter())
            for i, result in zip(running, response):
                self._advance(i, episodes[i], result.sequences[0], managers[i])
        return [episode.output() for episode in episodes]

    def _adapter(self) -> dict[str, str]:
        given = {"adapter_name": self.adapter_name, "adapter_uri": self.adapter_uri}
        return {key: value for key, value in given.items() if value is not None}

    def _start(self, index: int, trajectory: Mapping[str, Any]) -> Episode:
        source = trajectory.model_dump() if hasattr(trajectory, "model_dump") else trajectory
        messages = [_plain(m) for m in source.get("messages") or []]
        tools = list(source.get("tools") or [])
        feature = self.template.encode(
            {"messages": messages, "tools": tools}, add_generation_prompt=True
        )
        if feature is None:
            raise ValueError(
                f"trajectories[{index}]: the prompt is longer than the template's max_length "
                f"({self.template.max_length})"
            )
        episode = Episode(source=source, messages=messages, tools=tools)
        episode.add_context(list(feature["input_ids"]))
        return episode

    def _advance(self, index: int, episode: Episode, seq: Any, manager: Any) -> None:
        """Take one completion into ``episode`` and run the tool calls it makes."""
        episode.turns += 1
        episode.add_sampled(seq.tokens, seq.logprobs or [])
        content, calls = self._reply(seq)
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            assistant["tool_calls"] = calls
        episode.messages.append(assistant)
        episode.stop_reason = seq.stop_reason
        if seq.stop_reason == "length":
            return episode.finish(None, truncated=True)
        if not calls:
            return episode.finish(None)
        if episode.turns >= self.max_turns:
            return episode.finish("max_turns", truncated=True)
        if manager is None:
            raise ValueError(
                f"trajectories[{index}] made a tool call but has no tool_manager; pass "
                "tool_manager=... to the rollout or to the call"
            )
        results = [_tool_message(call, manager) for call in calls]
        if getattr(manager, "done", False):
            episode.messages += results
            return episode.finish("env_done")
        bridge = bridge_token_ids(
            self.template, episode.messages, results, episode.tools, seq.tokens
        )
        episode.messages += results
        if self._too_long(len(episode.input_ids) + len(bridge)):
            return episode.finish(None, truncated=True)
        episode.add_context(bridge)

    def _reply(self, seq: Any) -> tuple[str, list[dict[str, Any]]]:
        """The completion's text and the tool calls in it."""
        text = seq.text or ""
        calls = parse_tool_calls(text)
        if not calls and "<tool_call>" not in text:
            # A tokenizer that makes <tool_call> a special token drops it from ``text``.
            full = self.template.decode(seq.tokens)
            end_of_turn = self.template.decode([self.template.eos_token_id])
            full = full[: -len(end_of_turn)] if full.endswith(end_of_turn) else full
            if "<tool_call>" in full:
                text, calls = full, parse_tool_calls(full)
        return text, calls

    def _too_long(self, length: int) -> bool:
        limits = (self.max_trajectory_tokens, getattr(self.template, "max_length", None))
        return any(limit is not None and length >= limit for limit in limits)


def _single_sample(params: Any) -> SamplingParams:
    params = SamplingParams.coerce(params)
    if params.num_samples != 1:
        raise ValueError(
            f"ClientMultiTurnRollout samples one completion per trajectory (num_samples=1), got "
            f"num_samples={params.num_samples}; pass the trajectory several times for a group"
        )
    return params


def _per_trajectory(tool_manager: Any, count: int) -> list[Any]:
    if isinstance(tool_manager, (list, tuple)):
        if len(tool_manager) != count:
            raise ValueError(
                f"tool_manager: {len(tool_manager)} tool managers for {count} trajectories"
            )
        return list(tool_manager)
    return [tool_manager] * count


def _plain(message: Any) -> dict[str, Any]:
    if hasattr(message, "model_dump"):
        return message.model_dump(exclude_none=True)
    return dict(message)


def _tool_message(call: dict[str, Any], manager: Any) -> dict[str, Any]:
    name = call["function"]["name"]
    if "error" in call:
        content = f"Error: {call['error']}"
    else:
        content = str(manager(call))
    return {"role": "tool", "name": name, "content": content}
