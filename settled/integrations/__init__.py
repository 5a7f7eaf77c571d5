"""settled inside the agent frameworks people use: one module per framework, each
behind an extra of the same name, each a thin layer over the same
:class:`~settled.toolbox.Toolbox` as ``settled mcp`` (docs/integrations/)::

    settled.integrations.openai_agents     tools(**opts) -> list[agents.FunctionTool]
    settled.integrations.pydantic_ai       toolset(**opts) -> FunctionToolset
    settled.integrations.langchain         tools(**opts) -> list[BaseTool] (LangGraph interrupts)
    settled.integrations.claude_agent_sdk  server(**opts), hooks(**opts)

``opts``: ``config`` and ``db`` (the CLI's ``--config``/``--db``), ``operations``
(names to include, as ``"mail.send"``; default all) and ``wait`` (seconds of
verification in the call). The framework is imported only in its own module; a
missing one is ``MissingExtra`` naming the ``pip install`` that adds it.

What every module shares is in ``_kit`` (``Kit``): choosing the operations, reading a
call's arguments, sending, and the three moves of an approval (ask, approved,
declined), so that each framework's module only translates.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MissingExtra


def framework(module: str, extra: str) -> ModuleType:
    """``module`` imported, or ``MissingExtra`` naming the install that adds it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(
            f"settled.integrations.{extra} needs {module.partition('.')[0]}: "
            f"pip install 'settled[{extra}]'"
        ) from None


__all__ = ["framework"]
