"""deployctl: deploy and operate SGLang inference servers on multi-GPU hosts over SSH."""

__version__ = "0.1.0"

# Hosts worked on in parallel unless --forks says otherwise. Measured on 256 hosts (2 cores,
# loopback, benchmarks/README.md): 16 to 64 take the same time; each fork beyond costs
# client CPU, memory and descriptors. 32 halves 16's waits where the network adds latency.
DEFAULT_FORKS = 32
