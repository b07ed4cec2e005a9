"""specwatch: watch speculative decoding on inference nodes (acceptance drops, batch crossover, GPU regime)."""

__version__ = "0.1.0"
