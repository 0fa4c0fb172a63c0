"""deployctl: deploy and operate SGLang inference servers on multi-GPU hosts over SSH."""

__version__ = "0.1.0"
