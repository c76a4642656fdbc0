"""fedrepro: reproducible federated-learning aggregation methods."""

__version__ = "0.1.0"
