"""rlcore core: config, data types, algorithms, the training loop, checkpoints and monitors.

Nothing in this package imports a specific training backend or inference engine at import time.
"""
