"""EnterpriseOps-Gym (ICML 2026) rebuilt at smoke scale: a seeded SQLite enterprise sandbox (ITSM, HR, CSM and
hybrid tasks), policy-enforcing tools, template tasks with golden plans and state verifiers, agents and a harness
that reaches the tools in process or over MCP and the agent over an OpenAI-compatible endpoint on loopback.

Modules, by concept: `sandbox` (schema, seeded world, episodes and hashes), `tools` (the tool catalogue and its
policy), `tasks` (templates, golden plans, verifier derivation), `verifiers` (the official verifier semantics),
`agents` (offline agents), `endpoint` (the scripted OpenAI-compatible model), `harness` (episodes and the ReAct
loop), `mcp_server` (tools over MCP and the database API), `metrics`, `mutation`, `claims`, `stages`, `settings`.
"""
