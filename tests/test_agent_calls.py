"""The protocol's table of agent calls and the agent's own handlers name the same calls."""

from __future__ import annotations

import typing

from deployctl import agent
from deployctl.remote import handlers, measures, patch_types, protocol, routing, wire

DECLARED = {**vars(measures), **vars(patch_types), **vars(routing), **vars(protocol)}


def test_the_client_and_the_agent_name_the_same_calls() -> None:
    names = [spec.name for spec in protocol.CALLS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(handlers.HANDLERS)
    # No descriptor is left out of the table (but `echo`, which only a kept agent answers,
    # itself), and the client's calls are the protocol's.
    declared = [
        value
        for value in vars(protocol).values()
        if isinstance(value, protocol.Call) and value is not protocol.ECHO
    ]
    assert sorted(spec.name for spec in declared) == sorted(names)
    assert agent.CALLS is protocol.CALLS
    for spec in protocol.CALLS:
        assert getattr(agent, spec.name.upper()) is spec
    # What a kept agent answers is named by the host's lean module: calls of the table.
    assert {*names, protocol.ECHO.name} >= wire.SESSION_CALLS
    assert protocol.ECHO.name == wire.ECHO


def test_each_call_is_typed_by_its_handlers_typeddicts() -> None:
    for spec in protocol.CALLS:
        for declared in (spec.args, spec.reply):
            assert typing.is_typeddict(declared), f"{spec.name}: {declared} is not a TypedDict"
            # Declared by the protocol's modules, which the client may import.
            assert declared.__module__ in (
                protocol.__name__,
                measures.__name__,
                routing.__name__,
                patch_types.__name__,
            ), spec.name
        # The agent's modules import their types for the checker only (remote/wire.py says
        # why): their annotations are read with the declaring modules' names.
        answer = handlers.handler(spec.name)
        hints = typing.get_type_hints(answer, globalns={**DECLARED, **answer.__globals__})
        first = next(iter(hints))  # the handler's args; `apply` also takes the payload
        assert hints[first] is spec.args, f"{spec.name} takes {hints[first]}"
        assert hints["return"] is spec.reply, f"{spec.name} answers {hints['return']}"


def test_no_reply_has_an_error_key_the_client_would_read_as_the_agents_failure() -> None:
    """parse_reply takes any reply with `error` for the agent's own failure answer."""
    for spec in protocol.CALLS:
        assert "error" not in typing.get_type_hints(spec.reply), spec.name


def test_a_router_call_with_an_action_it_does_not_know_is_refused_without_asking_the_router() -> (
    None
):
    # Port 1: were the router asked, the reply would say that nothing answers there.
    args = {"bind_host": "127.0.0.1", "port": 1, "action": "list", "url": None, "wait": 0,
            "worker_type": None, "bootstrap_port": None}  # fmt: skip
    reply = handlers.handle(protocol.ROUTER.name, args)
    assert reply == {"error": "unknown router action 'list'", "code": "agent"}
