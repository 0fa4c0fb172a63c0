"""Development tools, not part of the installed package: `python -m tools.contract --write`
generates the shipped JSON Schemas (deployctl/data/schemas/)."""
