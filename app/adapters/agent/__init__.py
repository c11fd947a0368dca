"""The tunnel agent's edges: key files and cryptography, and the HTTP transport between roles."""
