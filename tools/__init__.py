"""Development tools, not part of the installed package: `python -m tools.contract --write`
generates the shipped JSON Schemas (deployctl/data/schemas/) from the typed documents
(deployctl/present/shapes/, through tools/typed_schema.py) and the few shapes tools/contract.py
still declares by hand."""
