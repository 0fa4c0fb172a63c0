"""deployctl's agent: the package that runs ON a host, with the host's python (stdlib only).

`protocol` (each call's arguments and reply, the call table), `wire` (what both ends use at
run time: the markers, the state_dir layout, the pure helpers), `lean` (JSON, SHA-256 and
signals without their modules' imports: a one-shot call pays for each import at its start;
the agent's modules import `typing` and the declarations for the type checker only), with
`measures` (the types of what is measured and kept: bench levels, the tune record),
`shapes` (the shape check of a value against its TypedDict), one module per concern
(`files`, `patches`, `sglang_options`, `locks`, `runs`, `slurm_jobs`, `bench`, `records`,
`router`), `handlers`, which maps each call to its handler (its module imported only when the
call comes), and `dispatch`, the entry point. Outside the package, only the declarations
(`protocol`, `wire`, `measures`, `routing`, `patch_types`, `placements`, `server_argv`) are
imported,
but by `agent.py`, which ships the package, and `ops/port.py`, which patches files as an
apply does (tests/test_layers.py).

deployctl ships the package as one bundle (a deterministic zip of its modules) named by the
sha256 of its bytes, unpacked once per host and state_dir into a private folder with a
manifest of its modules' sha256s, and runs each call through `bootstrap.BOOTSTRAP` as
`python -S -c BOOTSTRAP FOLDER DIGEST CALL JSON-ARGS` (DIGEST: the manifest's sha256), with any
payload on stdin; it reads one JSON document from stdout. A folder that is missing,
incomplete, damaged, or that another user could change, answers `AGENT_MISSING` and why
instead, and the client sends the bundle again. Each call is one round trip; the client checks every reply against its
declared type. Apply and revert read their whole input before touching anything, ignore a
dropped connection, and restore every file on failure, so a host is never left half-patched.
"""
