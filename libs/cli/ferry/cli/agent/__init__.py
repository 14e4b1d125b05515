"""Ferry for agents: an MCP server (`ferry mcp`) whose tools are the API's signals and its guarded
actions, and the OpenClaw skill that tells an agent how to use them (skills/ferry/SKILL.md)."""
