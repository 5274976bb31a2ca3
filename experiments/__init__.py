"""Small, self-contained experiments on what data parallelism and large batches do (run from the repository root)."""
