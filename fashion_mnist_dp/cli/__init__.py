"""The command line: train.py's LightningCLI and what it reads and checks (docs/architecture.md)."""
