"""The command line: train.py's LightningCLI (app), its shorthand flags (shorthand), the pre-launch checks (checks),
and the one way to run train.py as a subprocess (launch)."""
