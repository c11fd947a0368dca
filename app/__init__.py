"""qoss: Quality-of-Security-Service policy negotiation for IPsec."""

__all__ = ["__version__"]

__version__ = "0.1.0"
