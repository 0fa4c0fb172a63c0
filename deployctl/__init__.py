"""deployctl: deploy and operate SGLang inference servers on multi-GPU hosts over SSH."""

__version__ = "0.1.0"

# Hosts worked on in parallel unless --forks says otherwise.
DEFAULT_FORKS = 16
