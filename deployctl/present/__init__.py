"""Presentation any front end can import: documents, views and live sinks.

- `documents`: every `--json` document, built from the typed results of `ops`, each in the
  versioned envelope (`schema`);
- `views`: how people see each result (tables and lines), paired with its document;
- `live`: sinks for the events operations emit (progress line, log printer, `top`'s
  screen, `watch`'s event lines, JSON lines);
- `terminal`: the building blocks (console, tables, the one `error:`/`hint:` format).

Nothing here decides an exit status or imports the CLI.
"""
