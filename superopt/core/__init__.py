"""The ground floor every layer may import: the IR and its op table, packed formats, dtypes and
tolerances, the numpy reference evaluator, progress and deadline hooks. It imports nothing of superopt's
above it (the layer contract in `.importlinter`)."""
