"""Session tracking: the pure core (sessionize), and its Spark adapters (source, operator, job)."""
