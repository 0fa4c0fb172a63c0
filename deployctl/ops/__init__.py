"""Operations: read facts, act on a host, return a per-host result."""
