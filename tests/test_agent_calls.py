"""The client's table of agent calls and the agent's own handlers name the same calls."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from deployctl import agent, host_agent


def agent_handlers() -> dict[str, str]:
    """Each call host_agent.main answers, and the function it runs: read, not run."""
    tree = ast.parse(Path(host_agent.__file__).read_text(encoding="utf-8"))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    table = next(
        n.value
        for n in ast.walk(main)
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and n.target.id == "handlers"
    )
    assert isinstance(table, ast.Dict)
    handlers = {}
    for key, value in zip(table.keys, table.values, strict=True):
        assert isinstance(key, ast.Constant) and isinstance(value, ast.Lambda)
        assert isinstance(value.body, ast.Call) and isinstance(value.body.func, ast.Name)
        handlers[key.value] = value.body.func.id
    return handlers


def test_the_client_and_the_agent_name_the_same_calls() -> None:
    names = [spec.name for spec in agent.CALLS]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(agent_handlers())
    # No descriptor is left out of the table.
    declared = [value for value in vars(agent).values() if isinstance(value, agent.Call)]
    assert sorted(spec.name for spec in declared) == sorted(names)


def test_each_call_is_typed_by_its_handlers_typeddicts() -> None:
    handlers = agent_handlers()
    for spec in agent.CALLS:
        for declared in (spec.args, spec.reply):
            assert typing.is_typeddict(declared), f"{spec.name}: {declared} is not a TypedDict"
            assert declared.__module__ == host_agent.__name__, spec.name
        handler = getattr(host_agent, handlers[spec.name])
        hints = typing.get_type_hints(handler)
        first = next(iter(hints))  # the handler's args; `apply` also takes the payload
        assert hints[first] is spec.args, f"{spec.name} takes {hints[first]}"
        assert hints["return"] is spec.reply, f"{spec.name} answers {hints['return']}"


def test_no_reply_has_an_error_key_the_client_would_read_as_the_agents_failure() -> None:
    """parse_reply takes any reply with `error` for the agent's own failure answer."""
    for spec in agent.CALLS:
        assert "error" not in typing.get_type_hints(spec.reply), spec.name
